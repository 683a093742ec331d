"""The operator's pages in a real browser: Playwright driving Debian's Chromium against a live daphne.

Sign in, create a cluster, generate a join token (shown once), start a real agent with it and see
the node come online, cordon and uncordon it, send a command and see it succeed, open the Ray
dashboard page. A screenshot of every page goes to test-output/screenshots/.

Chromium comes from the distribution (`apt-get install chromium`, see .ci/setup); Playwright never
downloads a browser here. Without /usr/bin/chromium the test is skipped with that reason.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.db import connections

from fleet.models import Command, ComputeCluster, Node
from tests.support.live import agent_join, agent_run
from tests.support.processes import REPO_ROOT, wait_until

CHROMIUM = Path("/usr/bin/chromium")
SHOTS = REPO_ROOT / "test-output" / "screenshots"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Chromium is not installed (apt-get install chromium)"),
]


@pytest.fixture
def browser_page(monkeypatch):
    sync_api = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API keeps an event loop running in this thread; the ORM calls of the test are
    # still plain synchronous code (Django's documented escape hatch for exactly this case).
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(15000)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        yield page, errors
        # Playwright's sync API resumes the caller in a copy of its contextvars context, and Django keeps
        # connections per context (asgiref's Local): the ORM calls made since then (the test's own) have a
        # connection that the test database's clean-up never sees. Close it here, in that context, or the
        # test database is still in use when the session drops it.
        connections.close_all()
        context.close()
        browser.close()


def _shot(page, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_operator_journey_in_a_real_browser(browser_page, control_plane, operator, hub, tmp_path):
    page, errors = browser_page
    _, workspace = operator
    base = control_plane.url

    # sign in
    page.goto(f"{base}/accounts/login/")
    _shot(page, "01-login")
    page.fill("input[name=username]", "ops")
    page.fill("input[name=password]", "pw-ops")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")
    _shot(page, "02-dashboard")
    assert "ops" in page.content()

    # create a cluster
    page.goto(f"{base}/compute/")
    page.fill("input[name=name]", "browser-lab")
    page.select_option("select[name=workspace]", str(workspace.pk))
    page.select_option("select[name=mode]", "standalone")
    page.click("text=Create cluster")
    page.wait_for_load_state("networkidle")
    cluster = ComputeCluster.objects.get(workspace=workspace, name="browser-lab")
    _shot(page, "03-cluster-created")

    # generate a join token: the command is shown once
    page.goto(f"{base}/compute/clusters/{cluster.pk}/commands/")
    page.click("text=Generate Join Token")
    secret = page.wait_for_selector("#join-token code.secret")
    join_command = secret.inner_text()
    _shot(page, "04-join-token")
    token = re.search(r"CLUSTER_TOKEN=(ct_node_\S+)", join_command)
    assert token, join_command
    assert join_command.startswith(f"curl -fsSL {base}/agent/install.sh")  # the URL we reached it at
    assert "only once" in page.inner_text("#join-token")
    page.reload()
    assert token[1] not in page.content()

    # a real agent joins with it and comes online
    state = tmp_path / "state-browser"
    joined = agent_join(base, token[1], state)
    assert joined.returncode == 0, joined.stderr
    agent = agent_run(
        state,
        tmp_path,
        name="agent-browser",
        env={"CLEVERTHIS_MODEL_CACHE": str(tmp_path / "models"), "HF_ENDPOINT": hub.url},
    )
    try:
        wait_until(
            lambda: Node.objects.filter(cluster=cluster, status="online").exists(), timeout=30, what="node online"
        )
        node = Node.objects.get(cluster=cluster)
        page.goto(f"{base}/compute/clusters/{cluster.pk}/nodes/")
        row = page.locator(f"#node-{node.pk}")
        assert "online" in row.inner_text().lower()
        _shot(page, "05-node-online")

        # cordon it (htmx swaps the table in place)
        row.locator("text=Cordon").click()
        page.wait_for_function(
            f"document.querySelector('#node-{node.pk}') && "
            f"document.querySelector('#node-{node.pk}').innerText.toLowerCase().includes('cordoned')"
        )
        assert Node.objects.get(pk=node.pk).status == "cordoned"
        _shot(page, "06-node-cordoned")
        page.locator(f"#node-{node.pk}").locator("text=Uncordon").click()
        page.wait_for_function(
            f"document.querySelector('#node-{node.pk}') && "
            f"!document.querySelector('#node-{node.pk}').innerText.toLowerCase().includes('cordoned')"
        )
        assert Node.objects.get(pk=node.pk).status == "online"

        # send a command to All nodes and watch it succeed
        page.goto(f"{base}/compute/clusters/{cluster.pk}/commands/")
        page.select_option("select[name=command_type]", "model.download")
        page.wait_for_selector("#payload-fields input[name=p-model_id]")
        page.fill("#payload-fields input[name=p-model_id]", "acme/tiny")
        page.select_option("select[name=target]", "all")
        page.click("#command-form button[type=submit]")
        page.wait_for_load_state("networkidle")
        wait_until(
            lambda: Command.objects.filter(cluster=cluster, status="succeeded").count() == 1,
            timeout=60,
            what="command succeeded",
        )
        page.goto(f"{base}/compute/clusters/{cluster.pk}/commands/")
        assert "Succeeded" in page.inner_text("#commands")
        _shot(page, "07-command-succeeded")

        page.goto(f"{base}/compute/nodes/{node.pk}/")
        assert node.name in page.content()
        _shot(page, "08-node-detail")
    finally:
        agent.stop()

    # the Ray dashboard page
    page.goto(f"{base}/ray/")
    assert page.locator("h1").first.is_visible()
    _shot(page, "09-ray-dashboard")

    assert not errors, errors
    assert all((SHOTS / f"{n}.png").stat().st_size > 1000 for n in ("01-login", "05-node-online", "09-ray-dashboard"))

"""The operator's pages in a real browser: Playwright driving Debian's Chromium against a live daphne.

Sign in, create a cluster, generate a join token (shown once), start a real agent with it and see
the node come online, cordon and uncordon it, send a command and see it succeed, open the Ray
dashboard page, and the Usage page with the node's time. A screenshot of every page goes to
test-output/screenshots/.

Chromium comes from the distribution (`apt-get install chromium`, see .ci/setup); Playwright never
downloads a browser here. Without /usr/bin/chromium the test is skipped with that reason.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fleet.models import Command, ComputeCluster, Node
from fleet.usage import services as usage_services
from tests.support.browser import chromium, needs_chromium, watched_page
from tests.support.live import agent_join, agent_run
from tests.support.processes import REPO_ROOT, wait_until

SHOTS = REPO_ROOT / "test-output" / "screenshots"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    needs_chromium,
]


@pytest.fixture
def browser_page():
    SHOTS.mkdir(parents=True, exist_ok=True)
    with chromium() as browser:
        yield watched_page(browser.new_context(viewport={"width": 1280, "height": 900}))


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
    page.click("summary:has-text('Create Cluster')")  # the button opens the form
    page.fill("input[name=name]", "browser-lab")
    page.select_option("select[name=workspace]", str(workspace.pk))
    page.select_option("select[name=mode]", "standalone")
    page.click("#cluster-form button[type=submit]")
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
        usage_services.usage_sample()  # what beat does each minute: the online node's last minute is counted
    finally:
        agent.stop()

    # the Ray dashboard page
    page.goto(f"{base}/ray/")
    assert page.locator("h1").first.is_visible()
    _shot(page, "09-ray-dashboard")

    # the Usage page from the sidebar: the period swaps the report in place, the charts are drawn, CSV
    page.click("nav >> text=Usage")
    page.wait_for_url(f"{base}/usage/")
    page.select_option("#usage-filters select[name=period]", "1h")
    page.click("#usage-filters button[type=submit]")
    page.wait_for_url(re.compile(r".*period=1h.*"))
    page.wait_for_selector("#usage-chart-hours .chart-box svg")
    assert page.inner_text("[data-total=node_hours]") == "0.02"  # one node-minute
    assert "browser-lab" in page.inner_text("#usage-subjects")
    with page.expect_download() as download:
        page.click("#usage-csv")
    exported = Path(download.value.path()).read_text()
    assert exported.startswith("bucket_start,")
    assert f",cluster,{cluster.pk},,0,0,0,0,0,0.0,0.0,60,0,0" in exported  # its node-minute, no GPU, no container
    _shot(page, "10-usage")

    assert not errors, errors
    shots = ("01-login", "05-node-online", "09-ray-dashboard", "10-usage")
    assert all((SHOTS / f"{n}.png").stat().st_size > 1000 for n in shots)


WIDTHS = {"laptop": (1366, 900), "phone": (390, 844)}
LONG_LINE = "ray-log " + "x" * 2400  # one unbroken 2,400-character line, as logs have


def _fits(page) -> None:
    """No sideways scrolling: the document is never wider than the window."""
    scroll, inner = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert scroll <= inner, f"{page.url}: {scroll} px wide in a {inner} px window"


def _fleet_world(user, workspace):
    """A fleet with something on every page: nodes with an hour of history, failures, a namespace, Ray."""
    import datetime as dt
    import time
    import uuid

    from django.utils import timezone

    from agent import protocol
    from fleet import metrics_history, services
    from fleet.models import Command, CommandStatus
    from raymgr.models import RayCluster, RayClusterStatus
    from raymgr.workloads.models import JobStatus, TrainingJob
    from tests.fleet.conftest import facts_dict, make_csr_pem, make_key

    lab = services.cluster_create(actor=user, workspace=workspace, name="lab", mode="standalone")
    services.cluster_create(actor=user, workspace=workspace, name="empty", mode="standalone")
    nodes = []
    for name in ("gpu-box-1", "cpu-box-2"):
        _, raw = services.join_token_create(cluster=lab, actor=user)
        node, _ = services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts_dict(name))
        nodes.append(node)
    now = time.time()
    for minute in range(90, 0, -1):  # an hour and a half of beats, with a gap
        if 40 < minute < 46:
            continue
        wave = (minute * 7) % 100
        metrics_history.record(
            [
                metrics_history.Sample(nodes[0].pk, cpu=wave, memory=40 + minute % 20, gpu=100 - wave, vram=55),
                metrics_history.Sample(nodes[1].pk, cpu=minute % 30, memory=70),
            ],
            now=now - minute * 60,
        )
    gpu = protocol.GpuInfo(
        index=0, name="NVIDIA H100", memory_total_mb=81920, memory_used_mb=40960, utilization_percent=80
    )
    services.node_record_heartbeats(
        beats=[
            (nodes[0].pk, protocol.Heartbeat(cpu_percent=33, memory_percent=45, gpus=[gpu])),
            (nodes[1].pk, protocol.Heartbeat(cpu_percent=12, memory_percent=70)),
        ]
    )
    Command.objects.create(
        node=nodes[0],
        cluster=lab,
        command_type="container.create",
        idempotency_key=uuid.uuid4().hex,
        status=CommandStatus.FAILED,
        finished_at=timezone.now() - dt.timedelta(minutes=5),
        error_message="Traceback (most recent call last):\n  " + LONG_LINE + "\nRuntimeError: image not found",
    )
    services.namespace_create(actor=user, workspace=workspace, name="team-a", cluster_id=lab.pk)
    ray = RayCluster.objects.create(
        workspace=workspace,
        compute_cluster=lab,
        name="train-ray",
        status=RayClusterStatus.FAILED,
        failure_reason="head did not start",
        last_status={"logs": {"gcs": LONG_LINE, "autoscaler": LONG_LINE}},
        last_status_at=timezone.now(),
    )
    job = TrainingJob.objects.create(
        workspace=workspace, name="fine-tune", ray_cluster=ray, status=JobStatus.FAILED, logs=LONG_LINE * 3
    )
    return lab, nodes, ray, job


def test_fleet_pages_fit_a_laptop_and_a_phone(browser_page, control_plane, operator):
    """Every page of the fleet UI at 1366 px and 390 px: its content, no sideways overflow, a screenshot each
    (fleetui-<page>-<laptop|phone>.png); the pictures are drawn, and the new actions work by keyboard."""
    page, errors = browser_page
    user, workspace = operator
    base = control_plane.url
    lab, nodes, ray, job = _fleet_world(user, workspace)
    from cleverthis import fleet_history

    fleet_history.fleet_history_sample()  # what beat records each minute: the home page's pictures

    page.goto(f"{base}/accounts/login/")
    page.fill("input[name=username]", "ops")
    page.fill("input[name=password]", "pw-ops")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")

    pages = {
        "home": ("/", "#workspace-" + str(workspace.pk), "GPUs in use"),
        "compute": ("/compute/", "#clusters", "lab"),
        "nodes": (f"/compute/clusters/{lab.pk}/nodes/", "#nodes", "gpu-box-1"),
        "node": (f"/compute/nodes/{nodes[0].pk}/", "#utilization", "Utilization, last hour"),
        "commands": (f"/compute/clusters/{lab.pk}/commands/", "#command-form", "Command type"),
        "settings": (
            f"/compute/clusters/{lab.pk}/settings/",
            "main",
            "Cannot be changed after the cluster is created.",
        ),
        "namespaces": ("/compute/namespaces/", "#namespaces", "team-a"),
        "ray-clusters": ("/ray/clusters/", "#ray-cluster-rows", "train-ray"),
        "ray-create": ("/ray/clusters/new/", "main", "no online nodes"),
        "ray-logs": (f"/ray/clusters/{ray.pk}/?tab=logs", "#tab-body", "ray-log"),
        "training": (f"/ray/training/{job.pk}/", "main", "ray-log"),
        "ray-dashboard": ("/ray/", "main", "Clusters"),
        "audit": ("/audit/", "main", "namespace.create"),
        "usage": ("/usage/", "#usage-report", "completion tokens"),
    }
    for width_name, (width, height) in WIDTHS.items():
        page.set_viewport_size({"width": width, "height": height})
        for name, (path, selector, text) in pages.items():
            page.goto(f"{base}{path}")
            assert text in page.inner_text(selector), (name, width_name)
            _fits(page)
            _shot(page, f"fleetui-{name}-{width_name}")

    page.set_viewport_size({"width": 1366, "height": 900})
    # the pictures: the node page's two charts and the Nodes table's sparklines are drawn SVG, with text
    page.goto(f"{base}/compute/nodes/{nodes[0].pk}/")
    page.wait_for_selector("#utilization .chart-box svg polyline")
    assert page.locator("#utilization figure.chart").count() == 2
    legend = page.inner_text("#utilization .chart-legend")
    for label in ("CPU", "Memory", "GPU utilization", "VRAM"):
        assert label in legend
    assert "latest" in page.get_attribute("#utilization .chart-box", "aria-label")
    page.goto(f"{base}/compute/clusters/{lab.pk}/nodes/")
    page.wait_for_selector(f"#node-{nodes[0].pk} .spark svg polyline")
    assert page.locator(f"#node-{nodes[0].pk} .spark svg").count() == 4  # CPU, memory, GPU, VRAM

    # the home page's pictures: the fleet's last hour, drawn, each with its text alternative
    page.goto(f"{base}/")
    page.wait_for_selector(f"#chart-{workspace.pk}-nodes .chart-box svg polyline", state="attached")
    assert page.locator(f"#workspace-{workspace.pk} figure.chart .chart-box svg.chart-svg").count() == 6
    label = page.get_attribute(f"#chart-{workspace.pk}-nodes .chart-box", "aria-label")
    assert label.startswith("Nodes by state, last hour: Online: now 0, min 0, max 0; Offline: now 2")

    # the home page's numbers link to their pages
    page.click(f"#workspace-{workspace.pk} a:has-text('lab')")
    page.wait_for_url(f"{base}/compute/clusters/{lab.pk}/nodes/")

    # Create Cluster opens the form from the keyboard; ArgoCD fields only in argocd mode
    page.goto(f"{base}/compute/")
    assert not page.is_visible("#cluster-form")
    page.focus("details.create-panel > summary")
    page.keyboard.press("Enter")
    page.wait_for_selector("#cluster-form", state="visible")
    assert not page.is_visible("input[name=argocd_server]")
    page.select_option("select[name=mode]", "argocd")
    assert page.is_visible("input[name=argocd_server]")
    page.select_option("select[name=mode]", "standalone")
    assert not page.is_visible("input[name=argocd_server]")
    _shot(page, "fleetui-create-cluster-open")

    # the join command in a modal dialog, with a copy button
    page.goto(f"{base}/compute/clusters/{lab.pk}/commands/")
    page.click("text=Generate Join Token")
    page.wait_for_selector("dialog.join-token[open] #join-command")
    assert page.evaluate("document.querySelector('dialog.join-token').matches(':modal')")
    assert "only once" in page.inner_text("dialog.join-token")
    page.click("dialog.join-token button[data-copy-target]")
    page.wait_for_function("document.querySelector('#copy-status').textContent.length > 0")
    _fits(page)
    _shot(page, "fleetui-join-token-dialog")
    page.keyboard.press("Escape")

    # a namespace made from the page; a Ray cluster that cannot start is not offered
    page.goto(f"{base}/compute/namespaces/")
    page.fill("#namespace-form input[name=name]", "team-b")
    page.select_option("#namespace-form select[name=cluster]", str(lab.pk))
    page.click("#namespace-form button[type=submit]")
    page.wait_for_selector("text=Namespace team-b created.")
    page.goto(f"{base}/ray/clusters/new/")
    empty_option = page.locator("select[name=compute_cluster] option", has_text="empty")
    assert empty_option.get_attribute("disabled") is not None
    page.goto(f"{base}/ray/clusters/")
    row = page.locator(f"#ray-cluster-{ray.pk}")
    for action in ("Start", "Stop", "Delete"):
        assert row.locator(f"button:has-text('{action}')").count() == 1

    assert not errors, errors

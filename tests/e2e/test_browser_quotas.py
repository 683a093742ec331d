"""A quota refusal in a real browser (Chromium driven by Playwright against a live daphne).

The Owner opens the workspace's quotas from the home page, limits containers to 1, creates one container
from the Commands tab, and the second is refused with the quota, its limit, what is in use and what was
asked; the home page then shows the quota full. Screenshots go to test-output/screenshots/quotas-*.png.
No Celery worker and no agent: the node is registered and marked online, the create stays queued.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from fleet import services
from fleet.models import Node
from fleet.workloads.models import Container
from tests.support.browser import chromium, needs_chromium, sign_in, watched_page
from tests.support.live import ControlPlane, subprocess_env
from tests.support.processes import REPO_ROOT

SHOTS = REPO_ROOT / "test-output" / "screenshots"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True, reset_sequences=True),
    needs_chromium,
]


@pytest.fixture
def plane(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    live = ControlPlane(log_dir=tmp_path_factory.mktemp("plane"), env=subprocess_env())
    live.start_replica()
    yield live
    live.stop()


@pytest.fixture
def world(plane: ControlPlane) -> dict[str, Any]:
    """The Owner of a workspace with a cluster and one online node (no agent behind it)."""
    from tenancy import services as tenancy
    from tests.fleet.conftest import facts_dict, make_csr_pem, make_key

    user = get_user_model().objects.create_user("ops", password="pw-ops")
    workspace = tenancy.workspace_create(name="Ops", owner=user)
    cluster = services.cluster_create(actor=user, workspace=workspace, name="lab", mode="standalone")
    _, raw = services.join_token_create(cluster=cluster, actor=user)
    node, _ = services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts_dict("gpu-1"))
    Node.objects.filter(pk=node.pk).update(status="online", connected=True)
    return {"workspace": workspace, "cluster": cluster, "base": plane.url}


@pytest.fixture
def page(world: dict[str, Any]) -> Iterator[tuple[Any, list[str]]]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    with chromium() as browser:
        tab, errors = watched_page(browser.new_context(viewport={"width": 1366, "height": 900}), console=False)
        sign_in(tab, world["base"], "ops", "pw-ops")
        yield tab, errors


def _create(tab: Any, base: str, cluster: Any, name: str) -> None:
    tab.goto(f"{base}/compute/clusters/{cluster.pk}/commands/")
    tab.select_option("select[name=command_type]", "container.create")
    tab.wait_for_selector("#payload-fields input[name=p-name]")
    tab.fill("#payload-fields input[name=p-image]", "nginx:1.27")
    tab.fill("#payload-fields input[name=p-name]", name)
    tab.select_option("select[name=target]", "all")
    tab.click("#command-form button[type=submit]")
    tab.wait_for_load_state()


def test_owner_limits_containers_and_the_next_create_is_refused(page, world):
    tab, errors = page
    base, cluster, workspace = world["base"], world["cluster"], world["workspace"]

    # the home page shows usage against each quota, and leads to the quotas page
    assert tab.inner_text(f"#workspace-{workspace.pk} tr[data-quota=containers]").split() == [
        "Containers",
        "0",
        "unlimited",
    ]
    tab.click(f"#workspace-{workspace.pk} a[href='/workspaces/{workspace.pk}/quotas/']")
    tab.wait_for_url(f"{base}/workspaces/{workspace.pk}/quotas/")
    tab.fill("input[name=containers]", "1")
    tab.click("button:has-text('Save quotas')")
    tab.wait_for_selector("text=Quotas of Ops saved.")
    assert tab.inner_text("tr[data-quota=containers]").split() == ["Containers", "0", "1"]
    tab.screenshot(path=str(SHOTS / "quotas-1-set.png"), full_page=True)

    _create(tab, base, cluster, "web-1")  # admitted
    tab.wait_for_selector("text=container.create queued for 1 node(s).")
    _create(tab, base, cluster, "web-2")  # refused
    alert = tab.inner_text("p.error[role=alert]")
    assert alert == "Quota exceeded: Containers is limited to 1 in this workspace; 1 in use, 1 asked."
    tab.screenshot(path=str(SHOTS / "quotas-2-refused.png"), full_page=True)
    assert errors == [f"409 {base}/compute/clusters/{cluster.pk}/commands/"]
    assert list(Container.objects.values_list("name", flat=True)) == ["web-1"]

    tab.goto(f"{base}/")
    row = tab.locator(f"#workspace-{workspace.pk} tr[data-quota=containers]")
    assert row.get_attribute("class") == "at-limit"
    assert row.inner_text().split() == ["Containers", "1", "1", "full"]

"""What users still tripped over in the pages (issue 43), each checked in Chromium against a live daphne.

The API keys page: each checkbox sits beside its own label, the endpoint restriction is a list of
checkboxes with a filter, creating a key redirects (a reload makes no second key) and shows the secret once,
which Copy puts on the clipboard (read back from it). The home tile "endpoints running" opens the Endpoints
page. A stale form gets the product's page with the reason and a link back. Event names in the node and
endpoint event logs do not break inside at 1366 px. Screenshots at 1366 and 390 px go to
test-output/screenshots/page-fixes-*.png.

Each test has a daphne of its own (no Celery worker: nothing here is dispatched) and its own browser context,
signed in, with clipboard permissions.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connections

from fleet import services
from fleet.models import Node, NodeEvent
from fleet.workloads.models import EndpointEvent
from tenancy.models import ApiKey
from tests.support import browser
from tests.support.browser import needs_chromium
from tests.support.endpoints import endpoint_row
from tests.support.live import ControlPlane, subprocess_env
from tests.support.processes import REPO_ROOT

SHOTS = REPO_ROOT / "test-output" / "screenshots"
WIDTHS = {"1366": (1366, 900), "390": (390, 844)}
LONG_MESSAGE = (
    "The server on node gpu-box-with-a-long-name (port 8123) stopped answering its health checks "
    "(GET /health): it was taken out of rotation and told to stop, and a replacement is started on "
    "another node of the cluster; /var/lib/cleverthis/models/acme--tiny-llama-with-a-long-name/snapshots/main"
)
KINDS = ("endpoint.unresponsive", "endpoint.replica_replaced", "container.create.failed", "node.connected")

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


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    with browser.chromium() as launched:
        yield launched


@pytest.fixture
def world(plane: ControlPlane) -> dict[str, Any]:
    """An Owner of a workspace with a cluster, a node and a running endpoint on it."""
    from tenancy import services as tenancy
    from tests.fleet.conftest import facts_dict, make_csr_pem, make_key

    user = get_user_model().objects.create_user("ops", password="pw-ops")
    workspace = tenancy.workspace_create(name="Ops", owner=user)
    cluster = services.cluster_create(actor=user, workspace=workspace, name="lab", mode="standalone")
    _, raw = services.join_token_create(cluster=cluster, actor=user)
    node, _ = services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts_dict("gpu-box"))
    endpoint = endpoint_row(cluster=cluster, node=node, model_id="acme/tiny", status="running", port=9)
    other = endpoint_row(cluster=cluster, node=node, model_id="zeta/chat", status="running", port=10)
    return {
        "user": user,
        "workspace": workspace,
        "cluster": cluster,
        "node": node,
        "endpoint": endpoint,
        "other": other,
        "base": plane.url,
    }


@pytest.fixture
def page(chromium: Any, world: dict[str, Any]) -> Iterator[tuple[Any, list[str]]]:
    """A signed-in page at 1366 by 900 px that may read and write the clipboard; errors it met."""
    context = chromium.new_context(
        viewport={"width": 1366, "height": 900}, permissions=["clipboard-read", "clipboard-write"]
    )
    tab, errors = browser.watched_page(context, responses=False)
    browser.sign_in(tab, world["base"], "ops", "pw-ops")
    yield tab, errors
    connections.close_all()
    context.close()


def _shots(tab: Any, name: str) -> None:
    """Full-page screenshots at 1366 and 390 px (re-laid out, not reloaded), then back to 1366."""
    for width_name, (width, height) in WIDTHS.items():
        tab.set_viewport_size({"width": width, "height": height})
        tab.wait_for_timeout(100)
        tab.screenshot(path=str(SHOTS / f"page-fixes-{name}-{width_name}.png"), full_page=True)
    tab.set_viewport_size({"width": 1366, "height": 900})


def _beside(tab: Any, label_selector: str) -> dict[str, float]:
    """The gap between a label's checkbox and its text, and their vertical centres' distance."""
    return tab.eval_on_selector(
        label_selector,
        """label => {
            const box = label.querySelector('input').getBoundingClientRect();
            const text = label.querySelector('span').getBoundingClientRect();
            return {gap: text.left - box.right, dy: Math.abs((text.top + text.bottom) / 2 - (box.top + box.bottom) / 2),
                    boxWidth: box.width};
        }""",
    )


def test_api_keys_page_labels_checkboxes_redirects_and_shows_the_secret_once(page, world):
    tab, errors = page
    base = world["base"]
    tab.goto(f"{base}/compute/api-keys/")
    # each scope's checkbox sits right beside its own label, and clicking the words ticks that box
    for i in range(3):
        where = _beside(tab, f"label[for=id_scopes_{i}]")
        assert 0 <= where["gap"] <= 16, where
        assert where["dy"] <= 6, where
        assert where["boxWidth"] <= 24, where
    assert not tab.is_checked("#id_scopes_0")
    tab.click("label[for=id_scopes_0] span")
    assert tab.is_checked("#id_scopes_0")
    # the endpoint restriction: checkboxes, narrowed by a filter box (no Ctrl-click multi-select)
    assert tab.locator("select[multiple]").count() == 0
    assert tab.locator("#id_endpoints-list label.choice:visible").count() == 2
    tab.fill("input[data-filter-choices]", "zeta")
    tab.wait_for_timeout(50)
    visible = tab.locator("#id_endpoints-list label.choice:visible")
    assert visible.count() == 1
    assert f"endpoint-{world['other'].slug} (zeta/chat)" in visible.inner_text()
    visible.click()
    tab.fill("input[data-filter-choices]", "")
    tab.fill("#id_name", "ci-bot")
    _shots(tab, "api-keys-form")
    tab.click("#api-key-form button[type=submit]")
    # POST-redirect-GET: the page that shows the secret is a GET of the list
    tab.wait_for_selector("dialog.join-token[open] #api-key-secret")
    assert tab.evaluate("performance.getEntriesByType('navigation')[0].type") == "navigate"
    assert tab.url == f"{base}/compute/api-keys/"
    secret = tab.inner_text("#api-key-secret").strip()
    assert secret.startswith("ctk_")
    key = ApiKey.objects.get(name="ci-bot")
    assert key.display.removesuffix("…") in secret
    assert list(key.endpoint_grants.values_list("endpoint_id", flat=True)) == [world["other"].pk]
    tab.evaluate("navigator.clipboard.writeText('stale')")
    tab.click("dialog.join-token button:has-text('Copy')")
    tab.wait_for_function("document.querySelector('#copy-status').textContent.includes('Copied')")
    assert tab.evaluate("navigator.clipboard.readText()") == secret
    _shots(tab, "api-keys-created")
    tab.keyboard.press("Escape")
    # a reload shows the list, not the secret, and makes no second key
    response = tab.reload()
    assert "no-store" in response.headers.get("cache-control", "")
    assert tab.locator("#api-key-secret").count() == 0
    assert secret not in tab.content()
    assert ApiKey.objects.filter(name="ci-bot").count() == 1
    assert errors == []


def test_home_tile_opens_the_endpoints_page(page, world):
    tab, errors = page
    tab.goto(f"{world['base']}/")
    tab.click("a:has-text('endpoints running')")
    tab.wait_for_url(f"{world['base']}/compute/endpoints/")
    assert tab.locator("h1").first.inner_text().strip() == "Endpoints"
    _shots(tab, "home-endpoints")
    assert errors == []


def test_a_stale_form_shows_the_reason_and_a_way_back(page, world):
    tab, _ = page
    base = world["base"]
    tab.goto(f"{base}/compute/api-keys/")
    tab.fill("#id_name", "late")
    tab.check("#id_scopes_2")
    # the form's token no longer matches (signed in again elsewhere, or a forged form)
    tab.eval_on_selector("#api-key-form input[name=csrfmiddlewaretoken]", "e => e.value = 'x'.repeat(64)")
    tab.click("#api-key-form button[type=submit]")
    tab.wait_for_selector("section.refused")
    text = tab.inner_text("main")
    assert "403 Forbidden" not in text
    assert "reload the page and send it again" in text
    assert ApiKey.objects.filter(name="late").count() == 0
    _shots(tab, "refused-csrf")
    tab.click("section.refused a:has-text('Go back')")
    tab.wait_for_url(f"{base}/compute/api-keys/")


def _one_line_each(tab: Any, selector: str) -> dict[str, int]:
    """Event name → how many lines it is laid out on."""
    return tab.eval_on_selector_all(
        selector, "els => Object.fromEntries(els.map(e => [e.textContent.trim(), e.getClientRects().length]))"
    )


def test_event_names_do_not_break_inside_at_1366(page, world):
    tab, errors = page
    node: Node = world["node"]
    endpoint = world["endpoint"]
    for kind in KINDS:
        NodeEvent.objects.create(node=node, kind=kind, message=LONG_MESSAGE)
        EndpointEvent.objects.create(endpoint=endpoint, node=node, kind=kind, message=LONG_MESSAGE)
    for path, name in (
        (f"/compute/nodes/{node.pk}/", "node-events"),
        (f"/compute/endpoints/{endpoint.pk}/", "endpoint-events"),
    ):
        tab.goto(f"{world['base']}{path}")
        tab.wait_for_selector("table.events")
        lines = _one_line_each(tab, "table.events td:nth-child(2) code")
        assert set(KINDS) <= set(lines), lines
        assert {kind: n for kind, n in lines.items() if n != 1} == {}, f"{name}: event names broken inside"
        when = _one_line_each(tab, "table.events td:first-child")
        assert set(when.values()) == {1}, when
        _shots(tab, name)
    assert errors == []


def test_a_member_runs_workloads_and_reads_usage_by_key_name(chromium, world):
    """A Member sees Stop on the workspace's endpoints and New on the Ray workload pages, picks an API key by
    its name on the Usage page, and a succeeded training job reads Succeeded (never Queued)."""
    from datetime import UTC, datetime

    from fleet.usage import services as usage
    from fleet.usage.services import Rollup
    from raymgr.models import RayCluster
    from raymgr.workloads.models import TrainingJob
    from tenancy import services as tenancy

    member = get_user_model().objects.create_user("dev", password="pw-dev")
    tenancy.membership_set(workspace=world["workspace"], user=member, role="member")
    key = ApiKey.objects.create(
        user=member, workspace=world["workspace"], name="ci-bot", prefix="cibot123", secret_hash="a" * 64
    )
    minute = datetime.now(UTC).replace(second=0, microsecond=0)
    endpoint = world["endpoint"]
    usage.usage_add(
        rows=[Rollup("minute", minute, world["workspace"].pk, "endpoint", endpoint.pk, key.pk, 5, 0, 50, 60)]
    )
    usage.usage_add(rows=[Rollup("minute", minute, world["workspace"].pk, "endpoint", endpoint.pk, None, 7, 0, 1, 1)])
    ray = RayCluster.objects.create(
        workspace=world["workspace"], compute_cluster=world["cluster"], name="train", status="running"
    )
    job = TrainingJob.objects.create(
        workspace=world["workspace"],
        ray_cluster=ray,
        name="done",
        status="succeeded",
        queue_reason="Ray has the job pending: Job has not started yet.",  # a row from before the fix
    )
    context = chromium.new_context(viewport={"width": 1366, "height": 900})
    tab, errors = browser.watched_page(context, responses=False)
    try:
        base = world["base"]
        browser.sign_in(tab, base, "dev", "pw-dev")
        tab.goto(f"{base}/compute/endpoints/")
        assert tab.locator(f"tr[data-endpoint='{endpoint.slug}'] button:has-text('Stop')").count() == 1
        _shots(tab, "member-endpoints")
        tab.goto(f"{base}/ray/training/")
        assert tab.locator("a.button:has-text('New training job')").count() == 1
        tab.goto(f"{base}/ray/training/{job.pk}/")
        body = tab.inner_text("main")
        assert "Succeeded" in body
        assert "Queued" not in body
        assert "not started" not in body
        _shots(tab, "training-succeeded")
        tab.goto(f"{base}/usage/?period=1h")
        assert tab.inner_text("[data-total=requests]").strip() == "12"
        tab.select_option("select[name=api_key]", label="ci-bot (ctk_cibot123_…)")
        tab.click("#usage-filters button[type=submit]")
        tab.wait_for_function("document.querySelector('[data-total=requests]').textContent.trim() === '5'")
        _shots(tab, "usage-by-key")
        assert errors == []
    finally:
        connections.close_all()
        context.close()

"""What an operator hit in the browser (issue 35), each checked in Chromium against a live daphne.

Copy buttons put the text itself on the clipboard (read back from it); a private endpoint opens signed
in from the Endpoints page; the Endpoints tables fit a phone; Recent commands show their result; the
drain confirmation says where the containers go and two nodes of one host can be told apart; the dark
sidebar runs the whole length of a long page. Screenshots at 1366 and 390 px go to
test-output/screenshots/operator-fixes-*.png.

Each test has a daphne of its own (no Celery worker: nothing here is dispatched) and its own browser
context, signed in, with clipboard permissions. The database is emptied after each test and its content
types and permissions made again (`reset_sequences` keeps their ids stable).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connections

from fleet import services
from fleet.models import Command, CommandStatus, ComputeCluster, Node, NodeEvent
from tests.e2e.conftest import node_of, wait_status
from tests.support import browser
from tests.support.browser import needs_chromium
from tests.support.endpoints import endpoint_row
from tests.support.live import ControlPlane, agent_join, agent_run, subprocess_env
from tests.support.processes import REPO_ROOT, free_port, wait_until

SHOTS = REPO_ROOT / "test-output" / "screenshots"
WIDTHS = {"1366": (1366, 900), "390": (390, 844)}

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True, reset_sequences=True),
    needs_chromium,
]


@pytest.fixture
def plane(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A daphne of its own for each test: one shared by the module kept what it had cached of rows that
    the tests' database flushes replace (after other e2e modules had run, its pages answered "No such
    endpoint." for a new test's rows)."""
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
    """An operator (Owner of a workspace) with a cluster."""
    from tenancy import services as tenancy

    user = get_user_model().objects.create_user("ops", password="pw-ops")
    workspace = tenancy.workspace_create(name="Ops", owner=user)
    cluster = services.cluster_create(actor=user, workspace=workspace, name="lab", mode="standalone")
    return {"user": user, "workspace": workspace, "cluster": cluster, "base": plane.url}


@pytest.fixture
def page(chromium: Any, world: dict[str, Any]) -> Iterator[tuple[Any, list[str]]]:
    """A signed-in page at 1366 by 900 px that may read and write the clipboard; errors it met."""
    context = chromium.new_context(
        viewport={"width": 1366, "height": 900}, permissions=["clipboard-read", "clipboard-write"]
    )
    tab, errors = browser.watched_page(context, responses=False)
    browser.sign_in(tab, world["base"], "ops", "pw-ops")
    yield tab, errors
    # Playwright's sync API resumes the test in a copy of its contextvars context, where Django keeps
    # the connection of the test's own ORM calls: close it here, or the test database stays in use.
    connections.close_all()
    context.close()


def _shots(tab: Any, name: str) -> None:
    """Full-page screenshots at 1366 and 390 px (the page is re-laid out, not reloaded), then 1366 again."""
    for width_name, (width, height) in WIDTHS.items():
        tab.set_viewport_size({"width": width, "height": height})
        tab.wait_for_timeout(100)
        tab.screenshot(path=str(SHOTS / f"operator-fixes-{name}-{width_name}.png"), full_page=True)
    tab.set_viewport_size({"width": 1366, "height": 900})


def _node(cluster: ComputeCluster, user: Any, hostname: str, **fields: Any) -> Node:
    """A registered node (no agent) with `fields` set."""
    from tests.fleet.conftest import facts_dict, make_csr_pem, make_key

    _, raw = services.join_token_create(cluster=cluster, actor=user)
    node, _ = services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts_dict(hostname))
    if fields:
        Node.objects.filter(pk=node.pk).update(**fields)
        node.refresh_from_db()
    return node


def _clipboard(tab: Any) -> str:
    return tab.evaluate("navigator.clipboard.readText()")


def test_copy_buttons_put_the_text_itself_on_the_clipboard(page, world):
    """Item 1: the join command's Copy puts the command on the clipboard (not "#join-command"), the
    Endpoints page's Copy puts the URL there, and neither page throws."""
    tab, errors = page
    base, cluster = world["base"], world["cluster"]

    tab.goto(f"{base}/compute/clusters/{cluster.pk}/commands/")
    tab.click("text=Generate Join Token")
    command = tab.wait_for_selector("dialog.join-token[open] #join-command").inner_text().strip()
    assert command.startswith("curl "), command
    tab.evaluate("navigator.clipboard.writeText('stale')")
    tab.click("dialog.join-token button:has-text('Copy')")
    tab.wait_for_function("document.querySelector('#copy-status').textContent.includes('Copied')")
    tab.wait_for_timeout(300)  # a second handler writing later would overwrite it
    assert _clipboard(tab) == command
    _shots(tab, "join-token-copied")
    tab.keyboard.press("Escape")

    node = _node(cluster, world["user"], "copy-box")
    endpoint = endpoint_row(cluster=cluster, node=node, model_id="acme/tiny", status="running", port=9)
    for path in ("/compute/endpoints/", f"/compute/clusters/{cluster.pk}/endpoints/"):
        tab.goto(f"{base}{path}")
        tab.evaluate("navigator.clipboard.writeText('stale')")
        tab.click(f"tr[data-endpoint='{endpoint.slug}'] button:has-text('Copy')")
        tab.wait_for_function(
            f"document.querySelector(\"tr[data-endpoint='{endpoint.slug}']\").innerText.includes('Copied')"
        )
        tab.wait_for_timeout(300)
        assert _clipboard(tab) == endpoint.url, path
    _shots(tab, "endpoint-url-copied")
    assert not errors, errors


class Workload(BaseHTTPRequestHandler):
    """The server behind the endpoint: answers every GET with the path it was asked for."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = f'{{"object": "list", "data": [{{"id": "acme/tiny"}}], "path": "{self.path}"}}'.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_private_endpoint_opens_signed_in_from_the_endpoints_page(page, world, plane, tmp_path):
    """Item 3: a running private endpoint has an Open link on the Endpoints page; it goes through the
    ticket flow and arrives on the endpoint's own origin signed in, where the server on the node answers."""
    tab, errors = page
    base, cluster, user = world["base"], world["cluster"], world["user"]
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Workload)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    _, raw = services.join_token_create(cluster=cluster, actor=user)
    state = tmp_path / "state"
    joined = agent_join(base, raw, state)
    assert joined.returncode == 0, joined.stderr
    agent = agent_run(
        state,
        tmp_path,
        name="agent",
        env={"CLEVERTHIS_MODEL_CACHE": str(tmp_path / "models"), "CLEVERTHIS_PROXY_PORTS": str(port)},
    )
    try:
        node = node_of(state)
        wait_status(node, "online", timeout=30)
        # The agent's first inventory report after connecting (which says it has no Docker here) would fail
        # a hand-made endpoint row made before it: it lists only endpoints of its own.
        wait_until(lambda: NodeEvent.objects.filter(node=node, kind="agent.problem").exists(), timeout=30)
        endpoint = endpoint_row(
            cluster=cluster, node=node, model_id="acme/tiny", status="running", port=port, public=False
        )
        tab.goto(f"{base}/compute/endpoints/")
        link = tab.locator(f"tr[data-endpoint='{endpoint.slug}'] a:has-text('Open')")
        assert link.count() == 1, tab.inner_text("#endpoints")
        _shots(tab, "endpoint-open-link")
        link.click()
        tab.wait_for_url(f"http://{endpoint.hostname}:*/**")
        body = tab.inner_text("body")
        assert '"acme/tiny"' in body, body
        assert "/v1/models" in body, body
        _shots(tab, "endpoint-opened")
    finally:
        agent.stop()
        server.shutdown()
        server.server_close()
    assert not errors, errors


def test_endpoints_tables_fit_a_phone(page, world):
    """Item 4: at 390 px the Endpoints tables need no sideways scrolling, the URL reads in two or three
    lines (not one character per line) and Stop is on the screen."""
    tab, errors = page
    base, cluster, user = world["base"], world["cluster"], world["user"]
    node = _node(cluster, user, "gpu-box-with-a-rather-long-hostname-1")
    endpoint_row(cluster=cluster, node=node, model_id="meta-llama/Meta-Llama-3-8B-Instruct", status="running", port=9)
    endpoint_row(
        cluster=cluster,
        node=node,
        model_id="acme/tiny",
        status="failed",
        failure_code="weights_missing",
        failure_message="model weights are not yet downloaded",
    )
    pages = {"endpoints": "/compute/endpoints/", "cluster-endpoints": f"/compute/clusters/{cluster.pk}/endpoints/"}
    for name, path in pages.items():
        tab.goto(f"{base}{path}")
        _shots(tab, name)
        tab.set_viewport_size({"width": 390, "height": 844})
        tab.wait_for_timeout(100)
        scroll, inner = tab.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert scroll <= inner, f"{path}: {scroll} px wide in a {inner} px window"
        url = tab.locator("code.endpoint-url").first.bounding_box()
        line = tab.evaluate("parseFloat(getComputedStyle(document.querySelector('code.endpoint-url')).lineHeight)")
        assert url["height"] <= 3 * line + 2, (path, url, line)
        stop = tab.locator("button:has-text('Stop')").first.bounding_box()
        assert stop["x"] >= 0, (path, stop)
        assert stop["x"] + stop["width"] <= 390, (path, stop)
        tab.set_viewport_size({"width": 1366, "height": 900})
    assert not errors, errors


def test_recent_commands_show_their_result(page, world):
    """Item 8: the Result column of Recent commands says what each finished command produced, or its error."""
    tab, errors = page
    base, cluster, user = world["base"], world["cluster"], world["user"]
    node = _node(cluster, user, "result-box")

    def command(kind: str, status: str, **fields: Any) -> Command:
        return Command.objects.create(
            node=node,
            cluster=cluster,
            command_type=kind,
            idempotency_key=uuid.uuid4().hex,
            status=status,
            created_by=user,
            **fields,
        )

    download = command(
        "model.download",
        CommandStatus.SUCCEEDED,
        result={"model_id": "acme/tiny", "revision": "main", "path": "/x", "size_bytes": 4096, "files": 2},
    )
    create = command(
        "container.create",
        CommandStatus.SUCCEEDED,
        result={"container_id": "3f2a9c1d5e6b7a8c9d0e", "name": "web", "status": "running", "existed": False},
    )
    start = command(
        "endpoint.start",
        CommandStatus.SUCCEEDED,
        result={"endpoint_id": "ab12cd34ef56", "port": 8001, "pid": 4242, "device": "cpu", "log_tail": "x" * 500},
    )
    failed = command(
        "container.start", CommandStatus.FAILED, error_code="not_found", error_message="no container named db"
    )
    queued = command("container.stop", CommandStatus.QUEUED)

    tab.goto(f"{base}/compute/clusters/{cluster.pk}/commands/")
    shown = {
        c: tab.inner_text(f"#command-{c.pk} td:last-child").strip() for c in (download, create, start, failed, queued)
    }
    expected = {
        download: ("acme/tiny", "4.0", "KB", "2 files"),
        create: ("web", "running", "id 3f2a9c1d5e6b"),
        start: ("endpoint ab12cd34ef56", "port 8001", "cpu"),
        failed: ("not_found", "no container named db"),
    }
    for sent, words in expected.items():
        assert all(word in shown[sent] for word in words), (sent.command_type, shown[sent])
    assert "x" * 20 not in shown[start]  # the server's log stays out
    assert shown[queued] == "—"
    _shots(tab, "commands-result")
    assert not errors, errors


def test_drain_says_where_containers_go_and_nodes_of_one_host_differ(page, world):
    """Item 9: the drain confirmation says the containers move to other nodes of the cluster; two nodes
    named after one host carry their short node ids in the Nodes list, the command form and their pages."""
    tab, errors = page
    base, cluster, user = world["base"], world["cluster"], world["user"]
    first = _node(cluster, user, "twin-host", status="online", containers_count=2)
    second = _node(cluster, user, "twin-host", status="online")
    assert first.name == second.name == "twin-host"
    ids = {n.pk: n.pk.hex[:8] for n in (first, second)}

    tab.goto(f"{base}/compute/clusters/{cluster.pk}/nodes/")
    for node in (first, second):
        assert ids[node.pk] in tab.inner_text(f"#node-{node.pk} td:first-child"), ids
    asked: list[str] = []

    def answer(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.dismiss()

    tab.once("dialog", answer)
    tab.click(f"#node-{first.pk} button:has-text('Drain')")
    tab.wait_for_timeout(300)
    assert asked, "no confirmation"
    for words in ("2 running containers", "other nodes in the cluster", "cordoned", ids[first.pk]):
        assert words in asked[0], asked
    assert Node.objects.get(pk=first.pk).status == "online"  # dismissed: nothing happened
    _shots(tab, "nodes-twins")

    tab.goto(f"{base}/compute/clusters/{cluster.pk}/commands/")
    options = tab.eval_on_selector_all("select[name=target] option", "os => os.map(o => o.textContent)")
    assert len(set(options)) == len(options) == 3, options
    for node in (first, second):
        tab.goto(f"{base}/compute/nodes/{node.pk}/")
        assert ids[node.pk] in tab.inner_text("#node-facts"), ids
    _shots(tab, "node-twin-detail")
    assert not errors, errors


def test_sidebar_runs_the_whole_length_of_a_long_page(page, world):
    """Item 12: on a node page much longer than the window the dark sidebar reaches the page's end, and
    Sign out sits right under the navigation rather than floating at the first screen's bottom."""
    tab, errors = page
    base, cluster, user = world["base"], world["cluster"], world["user"]
    node = _node(cluster, user, "long-page-box")
    for i in range(60):
        services.node_event_record(node_id=node.pk, kind="note", message=f"event {i}: something happened")

    tab.goto(f"{base}/compute/nodes/{node.pk}/")
    height = tab.evaluate("document.documentElement.scrollHeight")
    assert height > 1800, height
    sidebar = tab.evaluate(
        "(() => { const r = document.querySelector('.sidebar').getBoundingClientRect();"
        " return {top: r.top + scrollY, bottom: r.bottom + scrollY}; })()"
    )
    assert sidebar["top"] <= 0, sidebar
    assert sidebar["bottom"] >= height - 1, (sidebar, height)
    nav_bottom = tab.evaluate("document.querySelector('.sidebar nav').getBoundingClientRect().bottom + scrollY")
    signout = tab.evaluate("document.querySelector('.sidebar .signout').getBoundingClientRect().top + scrollY")
    assert 0 <= signout - nav_bottom <= 48, (nav_bottom, signout)
    # the navigation stays at hand while scrolling
    tab.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
    assert tab.locator(".sidebar a:has-text('Compute')").is_visible()
    top = tab.evaluate("document.querySelector('.sidebar .brand').getBoundingClientRect().top")
    assert 0 <= top < 900, top
    tab.evaluate("window.scrollTo(0, 0)")
    _shots(tab, "node-long-page")
    assert not errors, errors

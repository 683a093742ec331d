"""The fleet home page's pictures, and node status changes pushed to open pages, in a real browser.

Playwright drives Debian's Chromium against a live daphne (and Celery worker). A frozen agent (SIGSTOP)
is marked offline by the lost-nodes pass (run here as beat runs it), and the open Nodes tab shows it
within PUSH_BOUND_S of the control plane knowing it, without a reload and without polling faster: the
change is pushed over the tab's /ws/live/ socket (`fleet.browser_push`), one frame per tab, and each tab
asks for its nodes table once. Screenshots at 1366 and 390 px go to test-output/screenshots/
(fleetlive-*.png).
"""

from __future__ import annotations

import datetime as dt
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections
from django.utils import timezone

from agent import protocol
from cleverthis import fleet_history
from fleet import services
from fleet.models import Command, CommandStatus, Node
from fleet.proxy import request_meter
from fleet.tasks import mark_lost_nodes_offline
from kernel import timeseries
from raymgr.models import RayCluster, RayClusterStatus
from tests.e2e.conftest import node_of
from tests.e2e.test_browser import WIDTHS, _fits, _shot, browser_page  # noqa: F401 (the fixture)
from tests.e2e.test_browser_live import _mark, _node, _not_reloaded, _sign_in
from tests.support.browser import needs_chromium
from tests.support.processes import wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    needs_chromium,
]

PUSH_BOUND_S = 5.0  # a status change shows within this of the control plane knowing it (pages poll every 30 s)


def _off_loop(fn, *args, **kwargs):
    """Run a service as the worker or a request thread does: on a thread with no event loop (Playwright's
    sync API keeps one running in the test's thread, and the push after the commit must not see it)."""

    def call():
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


def _status_shows(page, selector: str, text: str, since: float) -> float:
    """Seconds from `since` until the element shows `text` (fails past PUSH_BOUND_S)."""
    page.wait_for_function(
        "([s, t]) => { const e = document.querySelector(s); return e && e.innerText.includes(t); }",
        arg=[selector, text],
        timeout=PUSH_BOUND_S * 1000,
    )
    return time.monotonic() - since


def _connected(page) -> None:
    page.wait_for_function("window.CleverPush && window.CleverPush.connected()", timeout=10_000)


def test_node_status_changes_reach_open_pages_within_seconds(
    browser_page,  # noqa: F811
    control_plane,
    operator,
    cluster,
    agents,
):
    page, errors = browser_page
    owner, _ = operator
    base = control_plane.url
    proc, state, _ = agents(control_plane, cluster, owner, "frozen")
    node = node_of(state)
    wait_until(lambda: Node.objects.get(pk=node.pk).status == "online", timeout=30, what="online")
    row = f"#node-{node.pk}"
    nodes_path = f"/compute/clusters/{cluster.pk}/nodes/"

    page.set_viewport_size({"width": 1366, "height": 900})
    _sign_in(page, base)
    page.goto(f"{base}{nodes_path}")
    assert "Online" in page.inner_text(row)
    assert page.get_attribute("#nodes", "hx-trigger") == "every 30s"  # its own poll stays slow
    _connected(page)
    _mark(page)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if nodes_path in r.url else None)

    # the agent freezes; the lost-nodes pass (beat's, every 15 s) finds it silent and marks it offline
    proc.kill(signal.SIGSTOP)
    try:
        wait_until(
            lambda: _off_loop(mark_lost_nodes_offline) >= 0 and Node.objects.get(pk=node.pk).status == "offline",
            timeout=30,
            interval=0.5,
            what="offline by missed heartbeats",
        )
        known = time.monotonic()
        offline_s = _status_shows(page, row, "Offline", known)
        _shot(page, "fleetlive-nodes-offline-laptop")
        assert len(requests) == 1, requests  # one refresh of the table for the change
        # idle: no poll faster than the page's own 30 s
        page.wait_for_timeout(3000)
        assert len(requests) == 1, requests
    finally:
        proc.kill(signal.SIGCONT)
    wait_until(lambda: Node.objects.get(pk=node.pk).status == "online", timeout=30, what="back online")
    online_s = _status_shows(page, row, "Online", time.monotonic())
    assert _not_reloaded(page)

    # many tabs: each holds one socket, gets one frame per change and asks for its table once
    tabs = [page.context.new_page() for _ in range(4)]
    frames = {i: 0 for i in range(len(tabs))}
    gets = {i: 0 for i in range(len(tabs))}
    for i, tab in enumerate(tabs):
        tab.on(
            "websocket", lambda ws, i=i: ws.on("framereceived", lambda _f, i=i: frames.__setitem__(i, frames[i] + 1))
        )
        tab.goto(f"{base}{nodes_path}")
        _connected(tab)
        tab.on("request", lambda r, i=i: gets.__setitem__(i, gets[i] + 1) if nodes_path in r.url else None)
    _off_loop(services.node_cordon, node=Node.objects.select_related("cluster__workspace").get(pk=node.pk), actor=owner)
    changed = time.monotonic()
    cordoned_s = max(_status_shows(tab, row, "Cordoned", changed) for tab in tabs)
    tabs[0].wait_for_timeout(1000)
    assert set(frames.values()) == {1}, frames
    assert set(gets.values()) == {1}, gets
    for tab in tabs:
        tab.close()

    # draining, on a node's page at 390 px: the header's badge and the event log follow
    # a node without an agent: nothing reports an inventory over the one recorded here
    idle = _off_loop(_node, cluster, owner, "idle-box", online=True)
    busy = protocol.ContainerInfo(container_id="c1", name="web", image="busybox", status="running")
    services.node_record_inventory(node=idle, inventory=protocol.Inventory(containers=[busy]))
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{base}/compute/nodes/{idle.pk}/")
    _connected(page)
    _mark(page)
    _off_loop(services.node_drain, node=Node.objects.select_related("cluster__workspace").get(pk=idle.pk), actor=owner)
    draining_s = _status_shows(page, "#node-facts h1", "Draining", time.monotonic())
    _status_shows(page, "#events", "Status → draining", time.monotonic())
    assert _not_reloaded(page)
    _fits(page)
    _shot(page, "fleetlive-node-draining-phone")
    page.goto(f"{base}{nodes_path}")
    _fits(page)
    _shot(page, "fleetlive-nodes-phone")
    assert not errors, errors
    print(
        f"pushed: offline {offline_s:.2f} s after the pass marked it, online {online_s:.2f} s, "
        f"cordoned in 4 tabs {cordoned_s:.2f} s, draining {draining_s:.2f} s; 1 frame and 1 GET per tab per change"
    )


def _last_hour(workspace, cluster, node) -> None:
    """An hour of rollups as beat and the proxy record them, commands in the rows, and this minute's sample."""
    series = timeseries.workspace_series(workspace.pk)
    now = time.time()
    writes = []
    for ago in range(59, 0, -1):
        at = now - ago * 60
        wave = (ago * 7) % 60
        down = 1 if 20 <= ago <= 26 else 0
        values = {
            "nodes.online": 2 - down,
            "nodes.offline": down,
            "nodes.cordoned": 0,
            "nodes.draining": 0,
            "util.cpu": 20 + wave,
            "util.memory": 55 + ago % 10,
            "util.gpu": 80 - wave,
            "util.vram": 50,
            "ray.running": 1 if ago < 40 else 0,
            "ray.pending": 1 if ago >= 40 else 0,
            "ray.failed": 0,
            "ray.stopped": 0,
        }
        writes += [timeseries.Write(series, k, v, at=at) for k, v in values.items()]
        for _ in range(3 + ago % 5):
            request_meter.observe(series, 500 if ago % 11 == 0 else 200, 0.05 + (ago % 7) / 50, now=at)
    timeseries.record(writes)
    request_meter.flush()
    for ago in range(0, 45, 3):
        for failed in (False, ago % 9 == 0):
            c = Command.objects.create(
                node=node,
                cluster=cluster,
                command_type="container.stop",
                idempotency_key=uuid.uuid4().hex,
                status=CommandStatus.FAILED if failed else CommandStatus.SUCCEEDED,
            )
            Command.objects.filter(pk=c.pk).update(created_at=timezone.now() - dt.timedelta(minutes=ago))
    RayCluster.objects.create(workspace=workspace, compute_cluster=cluster, name="r", status=RayClusterStatus.RUNNING)
    fleet_history.fleet_history_sample()


def test_home_page_draws_the_fleets_last_hour(browser_page, control_plane, operator, cluster):  # noqa: F811
    page, errors = browser_page
    owner, workspace = operator
    base = control_plane.url
    first = _off_loop(_node, cluster, owner, "gpu-box-1", online=True)
    second = _off_loop(_node, cluster, owner, "cpu-box-2", online=True)
    gpu = protocol.GpuInfo(
        index=0, name="NVIDIA H100", memory_total_mb=81920, memory_used_mb=40960, utilization_percent=70
    )
    services.node_record_heartbeats(
        beats=[
            (first.pk, protocol.Heartbeat(cpu_percent=35, memory_percent=60, gpus=[gpu])),
            (second.pk, protocol.Heartbeat(cpu_percent=15, memory_percent=40)),
        ]
    )
    _last_hour(workspace, cluster, first)
    _sign_in(page, base)
    section = f"#workspace-{workspace.pk}"
    kinds = ("nodes", "utilization", "commands", "requests", "latency", "ray")
    for width_name, (width, height) in WIDTHS.items():
        page.set_viewport_size({"width": width, "height": height})
        page.goto(f"{base}/")
        for kind in kinds:
            page.wait_for_selector(f"#chart-{workspace.pk}-{kind} .chart-box svg polyline")
        assert page.locator(f"{section} figure.chart").count() == len(kinds)
        _fits(page)
        _shot(page, f"fleetlive-home-{width_name}")
    legends = page.inner_text(f"{section} .fleet-charts")
    for label in ("Online", "Offline", "CPU", "GPU utilization", "Commands", "Failed", "Requests", "Errors (5xx)"):
        assert label in legends, label
    assert "Slowest" in legends
    assert "Running" in legends
    assert page.get_attribute(f"#chart-{workspace.pk}-nodes .chart-box", "aria-label").startswith(
        "Nodes by state, last hour: Online: now 2, min 1, max 2"
    )
    # the numbers under the drawing: a data table per chart
    page.click(f"#chart-{workspace.pk}-commands summary")
    assert page.locator(f"#chart-{workspace.pk}-commands table tbody tr").count() >= 10

    # a node changes: the home page's tiles follow at once (pushed), without a reload
    page.set_viewport_size({"width": 1366, "height": 900})
    page.goto(f"{base}/")
    _connected(page)
    _mark(page)
    _off_loop(
        services.node_cordon, node=Node.objects.select_related("cluster__workspace").get(pk=second.pk), actor=owner
    )
    _status_shows(page, f"{section} .tiles", "1\ncordoned", time.monotonic())
    page.wait_for_selector(f"#chart-{workspace.pk}-nodes .chart-box svg polyline")  # redrawn after the swap
    assert _not_reloaded(page)
    _shot(page, "fleetlive-home-after-cordon-laptop")
    assert not errors, errors

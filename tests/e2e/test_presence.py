"""Honest online/offline with real processes: the web server, a Celery worker, Redis, PostgreSQL, real agents.

- kill -9 of an agent: its tunnel closes, the node goes offline NODE_OFFLINE_GRACE_S later through the
  pass the close scheduled on the real worker (no beat runs here, and heartbeat silence is set far off);
- a restart within the grace: the node never shows offline;
- SIGSTOP (the kernel keeps the TCP connection open): caught by the web server's WebSocket pings, and with
  pings out of the way by missed heartbeats; after SIGCONT the node is back online.

The tests print the detection times they saw; they never assert on wall-clock speed.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from fleet.models import Node, NodeEvent
from fleet.tasks import mark_lost_nodes_offline
from tests.e2e.conftest import node_of
from tests.support.live import ControlPlane, agent_run, subprocess_env
from tests.support.processes import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _status(node: Node) -> tuple[str, bool]:
    row = Node.objects.filter(pk=node.pk).values_list("status", "connected").get()
    return row[0], row[1]


class StatusWatch:
    """Polls a node's status in a thread and keeps every distinct (status, connected) it saw."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.seen: list[tuple[str, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from django.db import connection

        try:
            while not self._stop.is_set():
                current = _status(self.node)
                if not self.seen or self.seen[-1] != current:
                    self.seen.append(current)
                time.sleep(0.1)
        finally:
            connection.close()

    def __enter__(self) -> StatusWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture
def plane(tmp_path, settings):
    """A control plane with the default grace and heartbeat silence far off (60 s): only a close counts."""
    settings.NODE_OFFLINE_AFTER_S = 60
    control = ControlPlane(log_dir=tmp_path, env=subprocess_env(NODE_OFFLINE_AFTER_S="60"))
    control.start_replica()
    control.start_worker()
    yield control
    control.stop()


def test_a_killed_agent_goes_offline_after_the_grace_and_a_restart_brings_it_back(
    plane, cluster, operator, agents, settings
):
    user, _ = operator
    proc, state, env = agents(plane, cluster, user, "a")
    node = node_of(state)
    wait_until(lambda: _status(node) == ("online", True), timeout=30, what="online")
    wait_until(lambda: Node.objects.get(pk=node.pk).memory_percent > 0, timeout=15, what="a heartbeat")

    proc.kill()
    killed_at = time.monotonic()
    wait_until(lambda: _status(node) == ("online", False), timeout=15, what="the tunnel close recorded")
    closed_s = time.monotonic() - killed_at
    wait_until(lambda: _status(node)[0] == "offline", timeout=60, what="offline after the grace")
    offline_s = time.monotonic() - killed_at
    event = NodeEvent.objects.get(node=node, kind="offline")
    assert "Tunnel closed" in event.message, event.message
    assert "did not reconnect" in event.message

    restarted = agent_run(state, plane.log_dir, name="agent-a-restarted", env=env)
    try:
        wait_until(lambda: _status(node) == ("online", True), timeout=30, what="back online")
        kinds = list(NodeEvent.objects.filter(node=node).order_by("created_at", "pk").values_list("kind", flat=True))
        assert kinds[-3:] == ["disconnected", "offline", "connected"], kinds
    finally:
        restarted.stop()
    print(
        f"kill -9: tunnel close recorded {closed_s:.1f} s, offline {offline_s:.1f} s after the kill "
        f"(NODE_OFFLINE_GRACE_S={settings.NODE_OFFLINE_GRACE_S})"
    )


def test_an_agent_restarted_within_the_grace_never_shows_offline(plane, cluster, operator, agents, settings):
    user, _ = operator
    proc, state, env = agents(plane, cluster, user, "a")
    node = node_of(state)
    wait_until(lambda: _status(node) == ("online", True), timeout=30, what="online")
    with StatusWatch(node) as watch:
        proc.kill()
        wait_until(lambda: _status(node) == ("online", False), timeout=15, what="the tunnel close recorded")
        restarted = agent_run(state, plane.log_dir, name="agent-a-restarted", env=env)
        try:
            wait_until(lambda: _status(node) == ("online", True), timeout=30, what="reconnected")
            reconnect_at = time.monotonic()
            # past the grace and the pass the close scheduled (run on the worker), then once more here
            time.sleep(settings.NODE_OFFLINE_GRACE_S + 3)
            mark_lost_nodes_offline()
            assert _status(node) == ("online", True)
        finally:
            restarted.stop()
        waited_s = time.monotonic() - reconnect_at
    assert all(status == "online" for status, _ in watch.seen), watch.seen
    assert not NodeEvent.objects.filter(node=node, kind="offline").exists()
    assert "fleet.tasks.mark_lost_nodes_offline" in plane.worker.log()  # the pass the close scheduled ran
    print(f"restart within the grace: statuses seen {watch.seen}, watched {waited_s:.1f} s after the reconnect")


def test_a_frozen_agent_is_caught_by_pings_then_offline_after_the_grace(tmp_path, cluster, operator, agents, settings):
    """SIGSTOP: only the web server's unanswered ping can tell; the close it makes starts the grace.
    Short ping timings here (2 s idle, 3 s timeout) and the default grace; heartbeat silence 60 s."""
    user, _ = operator
    settings.NODE_OFFLINE_AFTER_S = 60
    env = subprocess_env(NODE_OFFLINE_AFTER_S="60", TUNNEL_PING_INTERVAL_S="2", TUNNEL_PING_TIMEOUT_S="3")
    control = ControlPlane(log_dir=tmp_path, env=env)
    proc = None
    try:
        control.start_replica()
        control.start_worker()
        proc, state, _ = agents(control, cluster, user, "a")
        node = node_of(state)
        wait_until(lambda: _status(node) == ("online", True), timeout=30, what="online")
        proc.kill(signal.SIGSTOP)
        stopped_at = time.monotonic()
        wait_until(lambda: not _status(node)[1], timeout=30, what="the frozen tunnel dropped by pings")
        dropped_s = time.monotonic() - stopped_at
        wait_until(lambda: _status(node)[0] == "offline", timeout=60, what="offline after the grace")
        offline_s = time.monotonic() - stopped_at
        assert "Tunnel closed" in NodeEvent.objects.get(node=node, kind="offline").message

        proc.kill(signal.SIGCONT)
        wait_until(lambda: _status(node) == ("online", True), timeout=30, what="back online after SIGCONT")
        print(f"SIGSTOP, pings 2+3 s: tunnel dropped {dropped_s:.1f} s, offline {offline_s:.1f} s after the stop")
    finally:
        if proc is not None:
            proc.kill(signal.SIGCONT)
        control.stop()


def test_a_frozen_agent_is_caught_by_missed_heartbeats_when_pings_do_not(tmp_path, cluster, operator, agents, settings):
    """The same freeze with the web server's pings too slow to matter (600 s): the lost-nodes pass (the beat's,
    run here every half second) finds no heartbeat for NODE_OFFLINE_AFTER_S (4 s here, heartbeats every
    1 s), marks the node offline and closes its half-open tunnel; after SIGCONT the agent reconnects."""
    user, _ = operator
    settings.NODE_OFFLINE_AFTER_S = 4
    env = subprocess_env(NODE_OFFLINE_AFTER_S="4", TUNNEL_PING_INTERVAL_S="600", TUNNEL_PING_TIMEOUT_S="600")
    control = ControlPlane(log_dir=tmp_path, env=env)
    proc = None
    try:
        control.start_replica()
        control.start_worker()
        proc, state, _ = agents(control, cluster, user, "a")
        node = node_of(state)
        wait_until(lambda: _status(node) == ("online", True), timeout=30, what="online")
        wait_until(lambda: "heartbeat sent" in proc.log(), timeout=15, what="a heartbeat")
        proc.kill(signal.SIGSTOP)
        stopped_at = time.monotonic()
        wait_until(
            lambda: mark_lost_nodes_offline() >= 0 and _status(node)[0] == "offline",
            timeout=60,
            interval=0.5,
            what="offline by missed heartbeats",
        )
        offline_s = time.monotonic() - stopped_at
        assert NodeEvent.objects.get(node=node, kind="offline").message == "No heartbeat for 4 s; status → offline"

        proc.kill(signal.SIGCONT)
        wait_until(lambda: _status(node) == ("online", True), timeout=30, what="back online after SIGCONT")
        # the agent logs its connect once the welcome arrives, just after the node is recorded connected
        wait_until(lambda: proc.log().count("connected to") == 2, timeout=15, what="the agent's reconnect")
        print(f"SIGSTOP, no pings: offline {offline_s:.1f} s after the stop (NODE_OFFLINE_AFTER_S=4)")
    finally:
        if proc is not None:
            proc.kill(signal.SIGCONT)
        control.stop()

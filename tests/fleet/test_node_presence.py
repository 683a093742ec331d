"""Honest online/offline: a closed tunnel → offline after NODE_OFFLINE_GRACE_S unless the agent came back.

Database tests of the services and the pass the beat (and each close) runs; the real processes
(web servers, agents killed and frozen) are in tests/e2e/test_presence.py.
"""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from django.utils import timezone

from agent import protocol
from fleet import enqueue, services
from fleet.models import ClusterEvent, Node, NodeEvent, NodeStatus
from fleet.tasks import mark_lost_nodes_offline

pytestmark = pytest.mark.django_db


@pytest.fixture
def scheduled(monkeypatch):
    """The tasks enqueued through `fleet.enqueue.send` (recorded, not sent: nothing consumes the queue here)."""
    calls: list[tuple[str, tuple, float | None]] = []
    monkeypatch.setattr(enqueue, "send", lambda name, *args, countdown=None: calls.append((name, args, countdown)))
    return calls


def _connect(node: Node, session: uuid.UUID | None = None, inbox: str = "specific.a!x") -> uuid.UUID:
    session = session or uuid.uuid4()
    services.node_connected(
        node=node, facts=protocol.HostFacts(hostname="h"), inventory=protocol.Inventory(), inbox=inbox, session=session
    )
    return session


def _closed_ago(node: Node, seconds: float) -> None:
    Node.objects.filter(pk=node.pk).update(disconnected_at=timezone.now() - dt.timedelta(seconds=seconds))


def _kinds(node: Node) -> list[str]:
    return list(NodeEvent.objects.filter(node=node).order_by("created_at", "pk").values_list("kind", flat=True))


def test_a_close_schedules_the_offline_pass_after_the_grace(
    cluster, register_node, scheduled, settings, django_capture_on_commit_callbacks
):
    settings.NODE_OFFLINE_GRACE_S = 7
    node = register_node(cluster)
    session = _connect(node)
    with django_capture_on_commit_callbacks(execute=True):
        services.node_disconnected(node=node, session=session)
    assert scheduled == [(enqueue.MARK_LOST_NODES_OFFLINE, (), 7 + services.OFFLINE_PASS_BATCH_S)]
    node.refresh_from_db()
    assert (node.status, node.connected) == (NodeStatus.ONLINE, False)
    assert node.disconnected_at is not None
    assert NodeEvent.objects.filter(node=node, kind="disconnected").get().message == (
        "Agent disconnected (tunnel closed); offline in 7 s unless it reconnects"
    )


def test_a_closed_tunnel_goes_offline_after_the_grace_with_an_event(cluster, register_node, scheduled, settings):
    settings.NODE_OFFLINE_GRACE_S = 10
    settings.NODE_OFFLINE_AFTER_S = 90
    node = register_node(cluster)
    services.node_disconnected(node=node, session=_connect(node))
    assert mark_lost_nodes_offline() == 0  # within the grace: still online
    assert Node.objects.get(pk=node.pk).status == NodeStatus.ONLINE
    _closed_ago(node, 12)
    assert mark_lost_nodes_offline() == 1
    node.refresh_from_db()
    assert node.status == NodeStatus.OFFLINE
    event = NodeEvent.objects.get(node=node, kind="offline")
    assert event.message == "Tunnel closed 12 s ago and the agent did not reconnect; status → offline"
    assert mark_lost_nodes_offline() == 0  # idempotent: a second pass (the beat's, another close's) finds nothing
    assert NodeEvent.objects.filter(node=node, kind="offline").count() == 1


def test_a_reconnect_within_the_grace_keeps_the_node_online_without_a_flap(cluster, register_node, scheduled, settings):
    settings.NODE_OFFLINE_GRACE_S = 10
    node = register_node(cluster)
    services.node_disconnected(node=node, session=_connect(node))
    _connect(node)  # the agent is back
    assert Node.objects.get(pk=node.pk).disconnected_at is None
    _closed_ago(node, 60)  # even a pass running long after the close (or a stale timestamp) leaves it
    assert mark_lost_nodes_offline() == 0
    node.refresh_from_db()
    assert (node.status, node.connected) == (NodeStatus.ONLINE, True)
    assert "offline" not in _kinds(node)


def test_the_late_close_of_an_old_socket_of_the_same_process_does_not_disconnect_the_new_tunnel(
    cluster, register_node, scheduled, settings
):
    """Both sockets on one process (same inbox): only the session id tells them apart."""
    node = register_node(cluster)
    old = _connect(node, inbox="specific.a!x")
    new = _connect(node, inbox="specific.a!x")
    services.node_disconnected(node=node, session=old)
    node.refresh_from_db()
    assert (node.connected, node.tunnel_session, node.disconnected_at) == (True, new, None)
    assert scheduled == []
    assert _kinds(node)[-1] == "connected"
    services.node_disconnected(node=node, session=new)
    assert not Node.objects.get(pk=node.pk).connected


def test_a_cordoned_node_whose_tunnel_closed_stays_cordoned_and_schedules_nothing(
    cluster, register_node, owner, scheduled, settings, django_capture_on_commit_callbacks
):
    node = register_node(cluster)
    session = _connect(node)
    services.node_cordon(node=node, actor=owner)
    with django_capture_on_commit_callbacks(execute=True):
        services.node_disconnected(node=node, session=session)
    assert scheduled == []
    _closed_ago(node, 60)
    assert mark_lost_nodes_offline() == 0
    assert Node.objects.get(pk=node.pk).status == NodeStatus.CORDONED
    event = NodeEvent.objects.filter(node=node, kind="disconnected").get()
    assert event.message == "Agent disconnected (tunnel closed)"


def test_a_silent_node_with_its_tunnel_still_open_goes_offline_by_missed_heartbeats(
    cluster, register_node, scheduled, settings
):
    settings.NODE_OFFLINE_AFTER_S = 90
    node = register_node(cluster)
    _connect(node)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - dt.timedelta(seconds=100))
    assert mark_lost_nodes_offline() == 1
    node.refresh_from_db()
    assert (node.status, node.connected) == (NodeStatus.OFFLINE, False)
    assert NodeEvent.objects.get(node=node, kind="offline").message == "No heartbeat for 90 s; status → offline"


def test_nodes_of_a_mass_close_go_offline_in_one_pass_and_count_towards_a_partition(
    cluster, register_node, scheduled, settings
):
    """A pass runs OFFLINE_PASS_BATCH_S after the grace: closes that close together are one pass together."""
    settings.NODE_OFFLINE_GRACE_S = 10
    nodes = [register_node(cluster, f"n{i}") for i in range(4)]
    for node in nodes:
        services.node_disconnected(node=node, session=_connect(node))
    Node.objects.filter(pk__in=[n.pk for n in nodes]).update(
        disconnected_at=timezone.now() - dt.timedelta(seconds=10 + services.OFFLINE_PASS_BATCH_S - 0.2)
    )
    assert mark_lost_nodes_offline() == 4
    assert ClusterEvent.objects.filter(cluster=cluster, kind="partition.suspected").exists()


def test_status_history_is_in_the_event_log(cluster, register_node, owner, scheduled, settings):
    """online → offline → online, cordon, drain: every status change is a line of the node's event log."""
    settings.NODE_OFFLINE_GRACE_S = 10
    node = register_node(cluster)
    services.node_disconnected(node=node, session=_connect(node))
    _closed_ago(node, 11)
    mark_lost_nodes_offline()
    _connect(node)
    services.node_cordon(node=node, actor=owner)
    services.node_uncordon(node=node, actor=owner)
    services.node_drain(node=node, actor=owner)
    messages = list(NodeEvent.objects.filter(node=node).order_by("created_at", "pk").values_list("kind", "message"))
    kinds = [kind for kind, _ in messages]
    tail = kinds[kinds.index("disconnected") :]
    assert tail == ["disconnected", "offline", "connected", "cordoned", "uncordoned", "draining", "drained"]
    assert messages[kinds.index("disconnected") + 2][1] == "Agent connected; status → online"

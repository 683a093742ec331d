"""Node state machine, tunnel-facing services, heartbeat, lost-node beat task and revocation."""

from __future__ import annotations

import datetime as dt

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.core.exceptions import PermissionDenied
from django.utils import timezone

from agent import protocol
from fleet import ca, groups, services
from fleet.models import Node, NodeCertificate, NodeEvent, NodeStatus, RevokedSerial
from fleet.tasks import mark_lost_nodes_offline
from fleet.workloads.tasks import drain_node
from kernel.exceptions import IllegalTransition

pytestmark = pytest.mark.django_db


def _status(node: Node) -> str:
    return Node.objects.values_list("status", flat=True).get(pk=node.pk)


def test_cordon_uncordon_cycle_and_illegal_moves(node, owner):
    services.node_cordon(node=node, actor=owner)
    assert _status(node) == NodeStatus.CORDONED
    with pytest.raises(IllegalTransition, match="Cannot cordon a node that is cordoned"):
        services.node_cordon(node=node, actor=owner)
    services.node_uncordon(node=node, actor=owner)
    assert _status(node) == NodeStatus.ONLINE
    with pytest.raises(IllegalTransition, match="Only cordoned or draining"):
        services.node_uncordon(node=node, actor=owner)
    kinds = list(NodeEvent.objects.filter(node=node).values_list("kind", flat=True))
    assert "cordoned" in kinds
    assert "uncordoned" in kinds


def test_uncordon_of_disconnected_node_goes_offline(cluster, register_node, owner):
    node = register_node(cluster, online=False)
    services.node_cordon(node=node, actor=owner)
    services.node_uncordon(node=node, actor=owner)
    assert _status(node) == NodeStatus.OFFLINE


def test_node_transitions_need_an_operator(node, workspace, member_of):
    viewer = member_of(workspace, "viewer")
    for fn in (services.node_cordon, services.node_drain, services.node_delete):
        with pytest.raises(PermissionDenied):
            fn(node=node, actor=viewer)
    with pytest.raises(PermissionDenied):
        services.node_rename(node=node, actor=viewer, name="x")
    assert _status(node) == NodeStatus.ONLINE


def test_drain_of_empty_node_goes_straight_to_cordoned(node, owner, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        services.node_drain(node=node, actor=owner)
    assert _status(node) == NodeStatus.CORDONED
    # nothing to wait for: the only thing after the commit is telling the open pages (fleet.browser_push)
    assert [c.__module__ for c in callbacks] == ["fleet.browser_push"] * len(callbacks)
    assert NodeEvent.objects.filter(node=node, kind="drained").exists()


def test_drain_with_a_container_and_no_other_node_waits_then_finishes_when_empty(
    node, owner, django_capture_on_commit_callbacks
):
    running = protocol.ContainerInfo(container_id="c1", name="web", image="busybox", status="running")
    services.node_record_inventory(node=node, inventory=protocol.Inventory(containers=[running]))
    node.refresh_from_db()
    assert node.containers_count == 1
    with django_capture_on_commit_callbacks() as callbacks:
        services.node_drain(node=node, actor=owner)
    assert _status(node) == NodeStatus.DRAINING
    assert len([c for c in callbacks if c.__module__ != "fleet.browser_push"]) == 1  # the drain pass
    with pytest.raises(IllegalTransition, match="Cannot drain a node that is draining"):
        services.node_drain(node=node, actor=owner)
    # No other node fits: the container stays, the drain says so and keeps waiting.
    assert drain_node(str(node.pk)) == NodeStatus.DRAINING
    assert NodeEvent.objects.filter(node=node, kind="drain.no_fit").exists()
    # Inventory shows the node empty: the drain completes.
    services.node_record_inventory(node=node, inventory=protocol.Inventory())
    assert _status(node) == NodeStatus.CORDONED
    assert drain_node(str(node.pk)) == NodeStatus.CORDONED


def test_offline_node_cannot_be_drained(cluster, register_node, owner):
    node = register_node(cluster, online=False)
    with pytest.raises(IllegalTransition, match="offline"):
        services.node_drain(node=node, actor=owner)


def test_rename(node, owner):
    services.node_rename(node=node, actor=owner, name="  big-gpu  ")
    node.refresh_from_db()
    assert node.name == "big-gpu"
    assert node.hostname == "gpu-box-1"


def test_delete_revokes_certificates_and_closes_the_tunnel(node, owner, django_capture_on_commit_callbacks):
    cert = NodeCertificate.objects.get(node=node)
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(groups.node_group(node.pk), channel)
    with django_capture_on_commit_callbacks(execute=True):
        services.node_delete(node=node, actor=owner)
    assert not Node.objects.filter(pk=node.pk).exists()
    assert RevokedSerial.objects.filter(serial=cert.serial).exists()
    with pytest.raises(ca.CertificateRejected, match="revoked"):
        ca.verify_node_certificate(cert.certificate_pem)
    message = async_to_sync(layer.receive)(channel)
    assert message == {"type": "node.revoke", "reason": "node deleted"}


def test_connected_disconnected_and_inventory(cluster, register_node):
    node = register_node(cluster, online=False)
    facts = protocol.HostFacts(hostname="gpu-box-1", cpu_count=32, memory_total_mb=128000, agent_version="0.2")
    inventory = protocol.Inventory(
        containers=[protocol.ContainerInfo(container_id="c1", name="web", image="nginx", status="running")],
        gpus=[protocol.GpuInfo(index=0, name="NVIDIA A100", memory_total_mb=40000, memory_used_mb=1000)],
    )
    services.node_connected(node=node, facts=facts, inventory=inventory)
    node.refresh_from_db()
    assert node.status == NodeStatus.ONLINE
    assert node.connected
    assert (node.cpu_count, node.agent_version, node.containers_count) == (32, "0.2", 1)
    assert node.gpu_model == "NVIDIA A100"
    assert node.vram_total_mb == 40000
    assert node.inventory["containers"][0]["container_id"] == "c1"
    services.node_disconnected(node=node)
    node.refresh_from_db()
    assert not node.connected
    assert node.status == NodeStatus.ONLINE  # the beat task decides when it is offline
    assert list(NodeEvent.objects.filter(node=node).values_list("kind", flat=True)[:2]) == [
        "disconnected",
        "connected",
    ]


def test_a_late_disconnect_of_an_old_socket_does_not_hide_the_agents_new_tunnel(cluster, register_node):
    node = register_node(cluster, online=False)
    facts, inventory = protocol.HostFacts(hostname="h"), protocol.Inventory()
    services.node_connected(node=node, facts=facts, inventory=inventory, inbox="specific.replica-a!x")
    # the agent reconnected through replica B before replica A noticed the old socket closed
    services.node_connected(node=node, facts=facts, inventory=inventory, inbox="specific.replica-b!y")
    services.node_disconnected(node=node, inbox="specific.replica-a!x")
    node.refresh_from_db()
    assert (node.connected, node.tunnel_inbox) == (True, "specific.replica-b!y")
    services.node_disconnected(node=node, inbox="specific.replica-b!y")
    node.refresh_from_db()
    assert (node.connected, node.tunnel_inbox) == (False, "")


def test_connected_keeps_cordoned_status(node, owner):
    services.node_cordon(node=node, actor=owner)
    services.node_connected(node=node, facts=protocol.HostFacts(hostname="h"), inventory=protocol.Inventory())
    assert _status(node) == NodeStatus.CORDONED


def test_heartbeat_is_one_update(cluster, register_node, django_assert_num_queries):
    node = register_node(cluster)
    heartbeat = protocol.Heartbeat(
        cpu_percent=42.5,
        memory_percent=50.0,
        memory_used_mb=32000,
        memory_total_mb=64000,
        gpus=[
            protocol.GpuInfo(
                index=0, name="NVIDIA H100", memory_total_mb=80000, memory_used_mb=20000, utilization_percent=75.0
            )
        ],
    )
    with django_assert_num_queries(1) as captured:
        services.node_record_heartbeat(node_id=node.pk, heartbeat=heartbeat)
    assert captured.captured_queries[0]["sql"].startswith("UPDATE")
    node.refresh_from_db()
    assert node.status == NodeStatus.ONLINE
    assert (node.cpu_percent, node.memory_used_mb, node.vram_used_mb, node.gpu_utilization_percent) == (
        42.5,
        32000,
        20000,
        75.0,
    )
    assert node.last_heartbeat_at is not None


def test_heartbeat_of_a_disconnected_node_leaves_it_offline(cluster, register_node):
    """Only a hello brings a node back: a heartbeat through a tunnel the database no longer holds (its
    close is recorded) is answered by closing that tunnel, and the node does not flip online unseen."""
    node = register_node(cluster, online=False)
    beat = protocol.Heartbeat(cpu_percent=5, memory_percent=5)
    assert services.node_record_heartbeats(beats=[(node.pk, beat)]) == {node.pk}
    assert _status(node) == NodeStatus.OFFLINE
    assert not NodeEvent.objects.filter(node=node, kind="online").exists()


def test_heartbeat_of_a_connected_offline_node_brings_it_online_with_an_event(cluster, register_node):
    node = register_node(cluster)
    Node.objects.filter(pk=node.pk).update(status=NodeStatus.OFFLINE)  # e.g. an uncordon racing a reconnect
    beat = protocol.Heartbeat(cpu_percent=5, memory_percent=5)
    assert services.node_record_heartbeats(beats=[(node.pk, beat)]) == set()
    assert _status(node) == NodeStatus.ONLINE
    assert NodeEvent.objects.get(node=node, kind="online").message == "Heartbeat received; status → online"
    services.node_record_heartbeats(beats=[(node.pk, beat)])
    assert NodeEvent.objects.filter(node=node, kind="online").count() == 1


def test_heartbeat_does_not_uncordon(node, owner):
    services.node_cordon(node=node, actor=owner)
    services.node_record_heartbeat(node_id=node.pk, heartbeat=protocol.Heartbeat(cpu_percent=1, memory_percent=1))
    assert _status(node) == NodeStatus.CORDONED


def test_mark_lost_nodes_offline(cluster, register_node, owner, settings):
    settings.NODE_OFFLINE_AFTER_S = 90
    lost = register_node(cluster, "lost")
    fresh = register_node(cluster, "fresh")
    cordoned = register_node(cluster, "cordoned")
    services.node_cordon(node=cordoned, actor=owner)
    old = timezone.now() - dt.timedelta(seconds=120)
    Node.objects.filter(pk__in=[lost.pk, cordoned.pk]).update(last_heartbeat_at=old)
    Node.objects.filter(pk=fresh.pk).update(last_heartbeat_at=timezone.now() - dt.timedelta(seconds=60))
    assert mark_lost_nodes_offline() == 1
    assert _status(lost) == NodeStatus.OFFLINE
    assert _status(fresh) == NodeStatus.ONLINE
    assert _status(cordoned) == NodeStatus.CORDONED  # only online → offline
    assert not Node.objects.get(pk=cordoned.pk).connected
    assert NodeEvent.objects.filter(node=lost, kind="offline").count() == 1
    assert mark_lost_nodes_offline() == 0


def test_beat_schedule_is_configured(settings):
    schedule = settings.CELERY_BEAT_SCHEDULE
    assert schedule["fleet-mark-lost-nodes-offline"] == {
        "task": "fleet.tasks.mark_lost_nodes_offline",
        "schedule": 15.0,
    }
    assert schedule["fleet-expire-join-tokens"]["task"] == "fleet.tasks.expire_join_tokens"

"""Healing endpoints: a replica lost with its node or whose server went away is replaced elsewhere and
leaves rotation; one on a draining node serves until its replacement runs, and the drain waits for it;
failed starts, stopped endpoints and healthy replicas are left alone; passes are idempotent."""

from __future__ import annotations

import pytest

from agent import protocol
from fleet.models import Command, Node, NodeEvent, NodeStatus
from fleet.proxy import endpoint_routes
from fleet.workloads import drain
from fleet.workloads import services as workloads
from fleet.workloads.models import EndpointReplica, EndpointStatus
from fleet.workloads.tasks import endpoints_heal_tick
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db

LLAMA = protocol.CachedModel(model_id="meta-llama/Llama-3.2-1B", revision="main", path="/cache/llama", size_bytes=5)


def running_endpoint(cluster, owner, replicas=2):
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, min_replicas=replicas)
    for port, replica in enumerate(EndpointReplica.objects.filter(endpoint=endpoint), start=8001):
        agent_side.result(replica.start_command, port=port)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.RUNNING
    return endpoint


def with_model(node):
    agent_side.inventory(node, models=[LLAMA])
    return node


def test_a_replica_on_a_node_gone_offline_is_replaced_on_another_node(cluster, register_node, owner):
    a, b = with_model(register_node(cluster, "a")), with_model(register_node(cluster, "b"))
    endpoint = running_endpoint(cluster, owner)
    lost = EndpointReplica.objects.get(endpoint=endpoint, node=a)
    c = with_model(register_node(cluster, "c"))
    Node.objects.filter(pk=a.pk).update(status=NodeStatus.OFFLINE)  # what the beat does to a lost node
    assert endpoints_heal_tick() == {str(endpoint.pk): 1}
    new = EndpointReplica.objects.get(replacement_of=lost)
    assert (new.node_id, new.status) == (c.pk, EndpointStatus.PENDING)
    assert new.node_id != b.pk  # b serves it already
    assert new.start_command.payload["endpoint_id"] == new.server_id
    lost.refresh_from_db()
    assert lost.status == EndpointStatus.STOPPING  # out of rotation; its stop waits for the node's return
    assert (lost.stop_command.node_id, lost.stop_command.payload) == (a.pk, {"endpoint_id": lost.server_id})
    event = NodeEvent.objects.get(node=c, kind="endpoint.replica_replaced")
    assert "node a is offline" in event.message
    assert lost.server_id in event.message
    logged = endpoint.events.get(kind="endpoint.replica_replaced")  # the endpoint's own log has it too
    assert (logged.node_id, logged.message, logged.data["replaced"]) == (c.pk, event.message, lost.server_id)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.RUNNING  # on b meanwhile
    assert endpoints_heal_tick() == {}  # nothing more to do
    agent_side.result(new.start_command, port=8009)
    assert sorted(r.node.name for r in endpoint.replicas.filter(status="running")) == ["b", "c"]
    # the node comes back, its agent stops the old server: the retired replica ends stopped
    Node.objects.filter(pk=a.pk).update(status=NodeStatus.ONLINE)
    agent_side.result(lost.stop_command)
    lost.refresh_from_db()
    endpoint.refresh_from_db()
    assert (lost.status, endpoint.status) == (EndpointStatus.STOPPED, EndpointStatus.RUNNING)


def test_a_replica_whose_server_is_gone_is_replaced_even_on_the_same_node(cluster, node, owner):
    with_model(node)
    endpoint = running_endpoint(cluster, owner, replicas=1)
    agent_side.inventory(node, models=[LLAMA], endpoints=[])  # the agent no longer runs it
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.FAILED
    (new,) = workloads.endpoint_heal(endpoint_id=endpoint.pk)
    assert new.node_id == node.pk
    assert new.replacement_of.server_id == endpoint.slug
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.PENDING
    agent_side.result(new.start_command, port=8100)
    endpoint.refresh_from_db()
    assert (endpoint.status, endpoint.port) == (EndpointStatus.RUNNING, 8100)
    assert workloads.endpoint_heal(endpoint_id=endpoint.pk) == []


def test_failed_starts_stopped_endpoints_and_healthy_replicas_are_left_alone(cluster, node, owner):
    with_model(node)
    failed = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id)
    agent_side.error(failed.start_command, "internal", "vllm crashed")
    healthy = running_endpoint(cluster, owner, replicas=1)
    stopped = running_endpoint(cluster, owner, replicas=1)
    workloads.endpoint_stop(actor=owner, endpoint=stopped)
    Node.objects.filter(pk=node.pk).update(status=NodeStatus.OFFLINE)
    starts = Command.objects.filter(command_type="endpoint.start").count()
    assert endpoints_heal_tick() == {str(healthy.pk): 0}  # lost with the node, but no other node to take it
    assert Command.objects.filter(command_type="endpoint.start").count() == starts
    assert not EndpointReplica.objects.filter(replacement_of__isnull=False).exists()


def test_a_draining_node_hands_its_replica_over_before_it_stops_and_the_drain_waits(
    cluster, register_node, owner, settings
):
    settings.ENDPOINT_DRAIN_S = 0
    a = with_model(register_node(cluster, "a"))
    with_model(register_node(cluster, "b"))
    endpoint = running_endpoint(cluster, owner)
    old = EndpointReplica.objects.get(endpoint=endpoint, node=a)
    c = with_model(register_node(cluster, "c"))
    Node.objects.filter(pk=a.pk).update(status=NodeStatus.DRAINING)
    assert endpoints_heal_tick() == {str(endpoint.pk): 1}
    new = EndpointReplica.objects.get(replacement_of=old)
    assert new.node_id == c.pk
    old.refresh_from_db()
    assert old.status == EndpointStatus.RUNNING  # still serving until the replacement runs
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.RUNNING
    endpoint_routes.forget_routes()
    route = endpoint_routes._load_route(endpoint.slug)
    assert old.server_id in {u.key for u in route.replicas}
    assert drain.drain_step(node_id=a.pk).status == NodeStatus.DRAINING  # waits for the replica
    assert endpoints_heal_tick() == {}  # nothing to do while the replacement starts

    agent_side.result(new.start_command, port=8009)
    endpoint_routes.forget_routes()
    route = endpoint_routes._load_route(endpoint.slug)
    assert old.server_id not in {u.key for u in route.replicas}  # out of rotation once its replacement runs
    settings.ENDPOINT_DRAIN_S = 3600
    assert endpoints_heal_tick() == {str(endpoint.pk): 0}
    old.refresh_from_db()
    assert old.status == EndpointStatus.RUNNING  # still finishing what it serves
    settings.ENDPOINT_DRAIN_S = 0
    assert endpoints_heal_tick() == {str(endpoint.pk): 0}  # drained: the old one stops now
    old.refresh_from_db()
    assert (old.status, old.stop_command.node_id) == (EndpointStatus.STOPPING, a.pk)
    agent_side.result(old.stop_command)
    assert drain.drain_step(node_id=a.pk).status == NodeStatus.CORDONED
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.RUNNING
    assert sorted(r.node.name for r in endpoint.replicas.filter(status="running")) == ["b", "c"]

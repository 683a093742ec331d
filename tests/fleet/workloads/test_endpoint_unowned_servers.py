"""Servers no live replica owns are ended: a start whose success comes after its replica's stop answered
`not_found` (the stop reached the agent first), in either order of the two outcomes, and servers the agent
reports that no live replica holds (`stray`, or of a stopped/failed replica) — one stop each, with why."""

from __future__ import annotations

import pytest

from agent import protocol
from fleet.models import Command, NodeEvent
from fleet.workloads import services as workloads
from fleet.workloads.models import EndpointEvent, EndpointReplica, EndpointStatus
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db

LLAMA = protocol.CachedModel(model_id="meta-llama/Llama-3.2-1B", revision="main", path="/cache/llama", size_bytes=5)


def stops_of(server_id: str) -> list[Command]:
    return list(
        Command.objects.filter(command_type="endpoint.stop", payload__endpoint_id=server_id).order_by("created_at")
    )


@pytest.fixture
def stopped_while_starting(cluster, node, owner):
    """An endpoint stopped while its start was in flight; its stop answered `not_found`: (endpoint, replica)."""
    agent_side.inventory(node, models=[LLAMA])
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id)
    agent_side.ack(endpoint.start_command)
    workloads.endpoint_stop(actor=owner, endpoint=endpoint)
    replica = EndpointReplica.objects.get(endpoint=endpoint)
    return endpoint, replica


def test_a_start_that_succeeds_after_its_stop_found_nothing_is_stopped(stopped_while_starting):
    endpoint, replica = stopped_while_starting
    agent_side.error(replica.stop_command, "not_found", f"no endpoint {replica.server_id} has run on this node")
    replica.refresh_from_db()
    assert replica.status == EndpointStatus.STOPPED
    assert len(stops_of(replica.server_id)) == 1

    agent_side.result(replica.start_command, endpoint_id=replica.server_id, port=8001, pid=4242)
    replica.refresh_from_db()
    assert replica.status == EndpointStatus.STOPPED  # still counted stopped, but its server is told to stop
    _, again = stops_of(replica.server_id)
    assert again.node_id == replica.node_id
    assert again.status == "queued"
    event = EndpointEvent.objects.get(endpoint=endpoint, kind="endpoint.server_unowned")
    assert f"started after replica {replica.server_id} was stopped" in event.message
    assert event.command_id == again.pk

    # the second stop finds the server: nothing more is sent
    agent_side.result(again, endpoint_id=replica.server_id, status="stopped", pid=4242)
    assert len(stops_of(replica.server_id)) == 2


def test_a_stop_not_found_that_arrives_after_the_start_succeeded_is_sent_again(stopped_while_starting):
    _, replica = stopped_while_starting
    agent_side.result(replica.start_command, endpoint_id=replica.server_id, port=8001, pid=4242)
    replica.refresh_from_db()
    assert replica.status == EndpointStatus.STOPPING  # the start's success while its stop is under way
    agent_side.error(replica.stop_command, "not_found", f"no endpoint {replica.server_id} has run on this node")
    replica.refresh_from_db()
    assert replica.status == EndpointStatus.STOPPED
    _, again = stops_of(replica.server_id)
    assert again.status == "queued"
    # that stop answering not_found too (the agent lost the server) sends no third one
    agent_side.error(again, "not_found", "gone")
    assert len(stops_of(replica.server_id)) == 2


def test_a_server_the_node_reports_that_no_live_replica_owns_is_stopped_once(cluster, node, owner):
    agent_side.inventory(node, models=[LLAMA])
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id)
    replica = EndpointReplica.objects.get(endpoint=endpoint)
    agent_side.error(replica.start_command, "internal", "did not answer GET /v1/models within 600s")
    assert EndpointReplica.objects.get(pk=replica.pk).status == EndpointStatus.FAILED

    leaked = protocol.EndpointInfo(endpoint_id=replica.server_id, model_id=LLAMA.model_id, port=8001, status="running")
    stray = protocol.EndpointInfo(endpoint_id="0123456789ab", model_id=LLAMA.model_id, port=8002, status="stray")
    agent_side.inventory(node, models=[LLAMA], endpoints=[leaked, stray])
    [stop_leaked] = stops_of(replica.server_id)
    [stop_stray] = stops_of("0123456789ab")
    assert {stop_leaked.node_id, stop_stray.node_id} == {node.pk}
    assert "still runs although replica" in EndpointEvent.objects.get(kind="endpoint.server_unowned").message
    note = NodeEvent.objects.get(node=node, kind="endpoint.server_unowned", data__server="0123456789ab")
    assert "runs outside its agent's records" in note.message

    agent_side.inventory(node, models=[LLAMA], endpoints=[leaked, stray])  # reported again: the stops are under way
    assert len(stops_of(replica.server_id)) == len(stops_of("0123456789ab")) == 1


def test_servers_of_live_replicas_are_left_alone(cluster, node, owner):
    agent_side.inventory(node, models=[LLAMA])
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id)
    replica = EndpointReplica.objects.get(endpoint=endpoint)
    starting = protocol.EndpointInfo(endpoint_id=replica.server_id, model_id=LLAMA.model_id, port=0, status="starting")
    agent_side.inventory(node, models=[LLAMA], endpoints=[starting])
    agent_side.result(replica.start_command, endpoint_id=replica.server_id, port=8001, pid=1)
    running = protocol.EndpointInfo(endpoint_id=replica.server_id, model_id=LLAMA.model_id, port=8001, status="running")
    agent_side.inventory(node, models=[LLAMA], endpoints=[running])
    assert stops_of(replica.server_id) == []

"""Endpoints of several replicas: placement on distinct nodes, one start per replica, the endpoint's status
summarising its replicas', stop of all, reconciliation per replica, and the migration of older endpoints."""

from __future__ import annotations

import importlib
import re

import pytest
from django.apps import apps
from django.core.exceptions import ValidationError

from agent import protocol
from fleet.models import Command
from fleet.workloads import services as workloads
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.services import PlacementError
from fleet.workloads.services.endpoints.replicas import endpoint_summarise
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db

LLAMA = protocol.CachedModel(model_id="meta-llama/Llama-3.2-1B", revision="main", path="/cache/llama", size_bytes=5)


def nodes_with_model(cluster, register_node, *names):
    nodes = [register_node(cluster, name) for name in names]
    for node in nodes:
        agent_side.inventory(node, models=[LLAMA])
    return nodes


def replicas(endpoint) -> list[EndpointReplica]:
    return list(EndpointReplica.objects.filter(endpoint=endpoint).order_by("created_at", "server_id"))


def test_replicas_start_on_distinct_nodes_holding_the_model_one_command_each(cluster, register_node, owner):
    a, b = nodes_with_model(cluster, register_node, "a", "b")
    register_node(cluster, "no-model")
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, min_replicas=2)
    assert (endpoint.min_replicas, endpoint.max_replicas, endpoint.status) == (2, 2, EndpointStatus.PENDING)
    first, second = replicas(endpoint)
    assert {first.node_id, second.node_id} == {a.pk, b.pk}
    assert first.server_id == endpoint.slug  # one replica looks on the wire as an endpoint always did
    assert re.fullmatch(r"[0-9a-f]{12}", second.server_id)
    assert second.server_id != endpoint.slug
    starts = Command.objects.filter(command_type="endpoint.start").order_by("created_at")
    assert [(c.node_id, c.payload["endpoint_id"]) for c in starts] == [
        (first.node_id, first.server_id),
        (second.node_id, second.server_id),
    ]
    assert [r.start_command_id for r in (first, second)] == [c.pk for c in starts]

    agent_side.result(first.start_command, port=8001)
    endpoint.refresh_from_db()
    assert (endpoint.status, endpoint.node_id, endpoint.port) == (EndpointStatus.RUNNING, first.node_id, 8001)
    # a replica that fails to start leaves the endpoint running on the other one
    agent_side.error(second.start_command, "internal", "vllm crashed")
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.RUNNING
    assert [r.status for r in replicas(endpoint)] == [EndpointStatus.RUNNING, EndpointStatus.FAILED]


def test_replicas_share_a_node_when_only_one_holds_the_model_and_vram_counts_each(cluster, node, owner):
    agent_side.inventory(node, models=[LLAMA])
    endpoint = workloads.endpoint_create(
        actor=owner, cluster=cluster, model_id=LLAMA.model_id, min_replicas=2, min_vram_mb=30000
    )
    assert [r.node_id for r in replicas(endpoint)] == [node.pk, node.pk]
    assert len({r.server_id for r in replicas(endpoint)}) == 2
    # two more need 60000 MB on top of the 60000 promised: the node has 79900 MB, so nothing is written
    with pytest.raises(PlacementError, match="insufficient GPU VRAM") as exc:
        workloads.endpoint_create(
            actor=owner, cluster=cluster, model_id=LLAMA.model_id, min_replicas=2, min_vram_mb=30000
        )
    assert exc.value.code == "insufficient_vram"
    assert Endpoint.objects.count() == 1
    assert EndpointReplica.objects.count() == 2


@pytest.mark.parametrize(
    ("counts", "field"),
    [
        ({"min_replicas": -1}, "min_replicas"),
        ({"min_replicas": 0, "max_replicas": 0}, "max_replicas"),
        ({"min_replicas": 33}, "min_replicas"),
        ({"min_replicas": 3, "max_replicas": 2}, "max_replicas"),
        ({"min_replicas": "2"}, "min_replicas"),
    ],
)
def test_bad_replica_counts_are_refused_with_the_field(cluster, node, owner, counts, field):
    agent_side.inventory(node, models=[LLAMA])
    with pytest.raises(ValidationError) as exc:
        workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, **counts)
    assert field in exc.value.message_dict
    assert not Endpoint.objects.exists()


def test_a_chosen_node_takes_one_replica(cluster, node, owner):
    agent_side.inventory(node, models=[LLAMA])
    with pytest.raises(ValidationError) as exc:
        workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, node=node, min_replicas=2)
    assert "node" in exc.value.message_dict


def test_stop_stops_every_replica_and_restart_places_them_again(cluster, register_node, owner):
    nodes_with_model(cluster, register_node, "a", "b")
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, min_replicas=2)
    for port, replica in enumerate(replicas(endpoint), start=8001):
        agent_side.result(replica.start_command, port=port)
    endpoint = workloads.endpoint_stop(actor=owner, endpoint=endpoint)
    assert endpoint.status == EndpointStatus.STOPPING
    stops = [r.stop_command for r in replicas(endpoint)]
    assert [s.payload for s in stops] == [{"endpoint_id": r.server_id} for r in replicas(endpoint)]
    assert {s.node_id for s in stops} == {r.node_id for r in replicas(endpoint)}
    agent_side.result(stops[0])
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.STOPPING  # until every replica stopped
    agent_side.result(stops[1])
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.STOPPED

    endpoint = workloads.endpoint_restart(actor=owner, endpoint=endpoint)
    assert endpoint.status == EndpointStatus.PENDING
    again = replicas(endpoint)
    assert len({r.node_id for r in again}) == 2
    assert all(r.status == EndpointStatus.PENDING and r.start_command not in stops for r in again)
    assert Command.objects.filter(command_type="endpoint.start").count() == 4


def test_inventory_fails_only_the_replica_gone_from_its_node(cluster, register_node, owner):
    a, b = nodes_with_model(cluster, register_node, "a", "b")
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, min_replicas=2)
    for port, replica in enumerate(replicas(endpoint), start=8001):
        agent_side.result(replica.start_command, port=port)
    gone = next(r for r in replicas(endpoint) if r.node_id == a.pk)
    agent_side.inventory(a, models=[LLAMA], endpoints=[])
    statuses = {r.server_id: r.status for r in replicas(endpoint)}
    assert statuses[gone.server_id] == EndpointStatus.FAILED
    assert [s for k, s in statuses.items() if k != gone.server_id] == [EndpointStatus.RUNNING]
    endpoint.refresh_from_db()
    assert (endpoint.status, endpoint.node_id) == (EndpointStatus.RUNNING, b.pk)


def test_a_start_from_the_commands_tab_makes_an_endpoint_of_one_replica(cluster, node, owner):
    from fleet import services

    (command,) = services.command_dispatch(
        actor=owner,
        cluster=cluster,
        command_type="endpoint.start",
        payload={"endpoint_id": "a1b2c3d4e5f6", "model_id": LLAMA.model_id},
        node=node,
    )
    endpoint = Endpoint.objects.get(slug="a1b2c3d4e5f6")
    (replica,) = replicas(endpoint)
    assert (replica.server_id, replica.node_id, replica.start_command_id) == ("a1b2c3d4e5f6", node.pk, command.pk)
    agent_side.result(command, port=8042)
    endpoint.refresh_from_db()
    assert (endpoint.status, endpoint.port) == (EndpointStatus.RUNNING, 8042)


def test_the_migration_makes_each_older_endpoint_one_replica_of_itself(cluster, node, owner):
    migration = importlib.import_module("fleet.migrations.0018_endpoint_replicas")
    running = Endpoint.objects.create(cluster=cluster, node=node, model_id="o/m", status="running", port=8123)
    failed = Endpoint.objects.create(
        cluster=cluster, node=None, model_id="o/n", status="failed", failure_code="node_lost", failure_message="gone"
    )
    migration.endpoints_to_replicas(apps, None)
    (one,) = replicas(running)
    assert (one.server_id, one.node_id, one.status, one.port) == (running.slug, node.pk, "running", 8123)
    (two,) = replicas(failed)
    assert (two.server_id, two.node_id, two.status, two.failure_code) == (failed.slug, None, "failed", "node_lost")


@pytest.mark.parametrize(
    ("states", "summary"),
    [
        (["running", "stopping"], "running"),
        (["starting", "failed"], "starting"),
        (["stopping", "stopped"], "stopping"),
        (["stopped", "failed"], "stopped"),
        (["failed", "failed"], "failed"),
    ],
)
def test_the_endpoint_summarises_its_replicas(cluster, register_node, owner, states, summary):
    nodes = nodes_with_model(cluster, register_node, "a", "b")
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, min_replicas=2)
    for index, (replica, state) in enumerate(zip(replicas(endpoint), states, strict=True)):
        code = "not_found" if state == "failed" else ""
        EndpointReplica.objects.filter(pk=replica.pk).update(status=state, port=8000 + index, failure_code=code)
    endpoint = endpoint_summarise(endpoint)
    assert endpoint.status == summary
    if summary == "running":
        assert (endpoint.node_id, endpoint.port) == (replicas(endpoint)[0].node_id, 8000)
    assert endpoint.failure_code == ("not_found" if summary in ("stopped", "failed") else "")
    assert {n.pk for n in nodes} >= {r.node_id for r in replicas(endpoint)}


def test_a_deleted_node_ends_only_its_replica(cluster, register_node, owner):
    a, b = nodes_with_model(cluster, register_node, "a", "b")
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, min_replicas=2)
    for port, replica in enumerate(replicas(endpoint), start=8001):
        agent_side.result(replica.start_command, port=port)
    assert workloads.endpoints_end_with_node(node=a, reachable=False) == 1
    statuses = {r.node_id: (r.status, r.failure_code) for r in replicas(endpoint)}
    assert statuses == {a.pk: ("failed", "node_lost"), b.pk: ("running", "")}
    endpoint.refresh_from_db()
    assert (endpoint.status, endpoint.node_id) == (EndpointStatus.RUNNING, b.pk)

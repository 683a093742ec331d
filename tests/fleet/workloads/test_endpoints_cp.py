"""Inference endpoints on the control plane: placement, start/stop outcomes, URL, reconciliation."""

from __future__ import annotations

import re

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from agent import protocol
from fleet import services
from fleet.models import Command, NodeEvent
from fleet.workloads import services as workloads
from fleet.workloads.models import Endpoint, EndpointStatus, NodeModel
from fleet.workloads.services import PlacementError
from kernel.exceptions import IllegalTransition
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db

LLAMA = protocol.CachedModel(model_id="meta-llama/Llama-3.2-1B", revision="main", path="/cache/llama", size_bytes=5)


def cache(node, *models) -> None:
    agent_side.inventory(node, models=list(models))


def test_start_on_the_node_with_the_model_and_record_running_with_url(cluster, register_node, owner, settings):
    settings.ENDPOINT_DOMAIN = "ep.example.com"
    register_node(cluster, "a")
    b = register_node(cluster, "b")
    cache(b, LLAMA)
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, min_vram_mb=4000)
    assert endpoint.node_id == b.pk
    assert endpoint.status == EndpointStatus.PENDING
    assert re.fullmatch(r"[0-9a-f]{12}", endpoint.slug)
    assert endpoint.url == f"https://endpoint-{endpoint.slug}.ep.example.com"
    command = endpoint.start_command
    assert (command.command_type, command.node_id) == ("endpoint.start", b.pk)
    assert command.payload == {
        "endpoint_id": endpoint.slug,
        "model_id": LLAMA.model_id,
        "revision": "main",
        "port": 0,
        "gpus": 0,
        "min_vram_mb": 4000,
        "extra_args": [],
    }
    agent_side.ack(command)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.STARTING
    agent_side.result(command, port=8123)
    endpoint.refresh_from_db()
    assert (endpoint.status, endpoint.port) == (EndpointStatus.RUNNING, 8123)
    assert NodeEvent.objects.filter(node=b, kind="endpoint.running", message__contains=endpoint.url).exists()


def test_refused_when_the_model_is_not_downloaded_anywhere(cluster, node, owner):
    with pytest.raises(PlacementError) as exc:
        workloads.endpoint_create(actor=owner, cluster=cluster, model_id="org/absent")
    assert (
        str(exc.value)
        == "model weights are not yet downloaded: org/absent@main is on no online node; run model.download first"
    )
    assert exc.value.code == "model_not_downloaded"
    assert not Endpoint.objects.exists()
    assert not Command.objects.exists()


def test_refused_when_no_node_with_the_model_has_enough_vram(cluster, node, owner):
    cache(node, LLAMA)
    with pytest.raises(PlacementError) as exc:
        workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, gpus=1, min_vram_mb=90000)
    # The fixture's node has one 80000 MB GPU with 100 MB used.
    assert str(exc.value) == "insufficient GPU VRAM: needs 90000 MB, best node gpu-box-1 has 79900 MB free"
    assert exc.value.code == "insufficient_vram"
    assert not Endpoint.objects.exists()


def test_cordoned_nodes_and_other_revisions_do_not_count(cluster, register_node, owner):
    a = register_node(cluster, "a")
    b = register_node(cluster, "b")
    cache(a, LLAMA)
    cache(b, protocol.CachedModel(model_id=LLAMA.model_id, revision="v2", path="/c"))
    services.node_cordon(node=a, actor=owner)
    with pytest.raises(PlacementError):
        workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id)
    assert workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, revision="v2").node == b


def test_explicit_node_must_hold_the_model_and_be_in_the_cluster(cluster, register_node, other_cluster, owner):
    a = register_node(cluster, "a")
    with pytest.raises(PlacementError, match=r"not yet downloaded: .* not in node a's cache"):
        workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, node=a)
    theirs = register_node(other_cluster, "theirs")
    with pytest.raises(ValidationError) as exc:
        workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, node=theirs)
    assert "node" in exc.value.message_dict


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"model_id": "not a model"}, "model_id"),
        ({"model_id": "a/b/c"}, "model_id"),
        ({"model_id": "x" * 201}, "model_id"),
        ({"model_id": 5}, "model_id"),
        ({"revision": "../etc"}, "revision"),
        ({"gpus": -1}, "gpus"),
        ({"gpus": "1"}, "gpus"),
        ({"public": "yes"}, "public"),
    ],
)
def test_bad_input_is_a_field_error(cluster, node, owner, fields, field):
    kwargs = {"model_id": LLAMA.model_id, **fields}
    with pytest.raises(ValidationError) as exc:
        workloads.endpoint_create(actor=owner, cluster=cluster, **kwargs)
    assert field in exc.value.message_dict


def test_members_start_and_stop_endpoints_and_viewers_cannot(cluster, node, workspace, member_of, owner):
    cache(node, LLAMA)
    users = {role: member_of(workspace, role) for role in ("member", "viewer")}
    with pytest.raises(PermissionDenied, match="Owners, Admins and Members"):
        workloads.endpoint_create(actor=users["viewer"], cluster=cluster, model_id=LLAMA.model_id)
    assert not Endpoint.objects.exists()
    endpoint = workloads.endpoint_create(actor=users["member"], cluster=cluster, model_id=LLAMA.model_id)
    assert endpoint.start_command.command_type == "endpoint.start"  # the Member's own start, queued
    with pytest.raises(PermissionDenied):
        workloads.endpoint_stop(actor=users["viewer"], endpoint=endpoint)
    agent_side.result(endpoint.start_command, port=8123)
    endpoint = workloads.endpoint_stop(actor=users["member"], endpoint=endpoint)
    assert endpoint.status == EndpointStatus.STOPPING


@pytest.mark.parametrize(
    ("code", "title"),
    [("weights_missing", "Model weights are not yet downloaded"), ("insufficient_vram", "Insufficient GPU VRAM")],
)
def test_agent_refusal_fails_the_endpoint_with_code_and_help(cluster, node, owner, code, title):
    cache(node, LLAMA)
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id)
    agent_side.error(endpoint.start_command, code, "agent says no")
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.FAILED
    assert (endpoint.failure_code, endpoint.failure_message) == (code, "agent says no")
    event = NodeEvent.objects.get(node=node, kind="endpoint.failed")
    assert title in event.message
    assert "agent says no" in event.message
    assert event.data["error_help"]["code"] == code


def test_stop_then_agent_confirms(cluster, node, owner):
    cache(node, LLAMA)
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id)
    agent_side.result(endpoint.start_command, port=9000)
    endpoint = workloads.endpoint_stop(actor=owner, endpoint=endpoint)
    assert endpoint.status == EndpointStatus.STOPPING
    assert endpoint.stop_command.payload == {"endpoint_id": endpoint.slug}
    with pytest.raises(IllegalTransition):
        workloads.endpoint_stop(actor=owner, endpoint=endpoint)
    agent_side.result(endpoint.stop_command)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.STOPPED
    with pytest.raises(IllegalTransition, match="stopped"):
        workloads.endpoint_stop(actor=owner, endpoint=endpoint)
    # A late duplicate start outcome does not revive it.
    workloads.endpoint_record_command_outcome(command=endpoint.start_command)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.STOPPED


def test_success_without_a_port_is_a_failure(cluster, node, owner):
    cache(node, LLAMA)
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id)
    agent_side.result(endpoint.start_command, port="80")
    endpoint.refresh_from_db()
    assert (endpoint.status, endpoint.failure_code) == (EndpointStatus.FAILED, "internal")


def test_inventory_keeps_endpoints_in_step(cluster, node, owner):
    cache(node, LLAMA)
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id)
    info = protocol.EndpointInfo(endpoint_id=endpoint.slug, model_id=LLAMA.model_id, port=8001, status="running")
    agent_side.inventory(node, models=[LLAMA], endpoints=[info])
    endpoint.refresh_from_db()
    assert (endpoint.status, endpoint.port) == (EndpointStatus.RUNNING, 8001)
    agent_side.inventory(node, models=[LLAMA], endpoints=[])  # agent restarted: the process is gone
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.FAILED
    assert endpoint.failure_code == "not_found"


def test_vram_promised_to_starting_endpoints_counts_and_load_spreads(cluster, register_node, owner):
    a = register_node(cluster, "a")
    b = register_node(cluster, "b")
    cache(a, LLAMA)
    cache(b, LLAMA)
    first = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, min_vram_mb=50000)
    second = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, min_vram_mb=50000)
    assert {first.node_id, second.node_id} == {a.pk, b.pk}  # each node has 79900 MB: one each
    with pytest.raises(PlacementError, match=r"needs 50000 MB, best node \w has 29900 MB free"):
        workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, min_vram_mb=50000)
    with pytest.raises(PlacementError, match="and 2 GPU"):
        workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, gpus=2)


def test_model_download_result_records_the_snapshot(cluster, node, owner):
    (command,) = services.command_dispatch(
        actor=owner,
        cluster=cluster,
        command_type="model.download",
        payload={"model_id": "org/tiny", "revision": "v1"},
        node=node,
    )
    agent_side.result(command, path="/cache/org--tiny/v1", size_bytes=1234)
    (row,) = NodeModel.objects.filter(model_id="org/tiny")
    assert (row.node_id, row.revision, row.path, row.size_bytes) == (node.pk, "v1", "/cache/org--tiny/v1", 1234)
    # Now an endpoint can start from it.
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id="org/tiny", revision="v1")
    assert endpoint.node_id == node.pk


def test_failed_download_is_explained(cluster, node, owner):
    (command,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="model.download", payload={"model_id": "org/nope"}, node=node
    )
    agent_side.error(command, "model_not_found", "404 Repository Not Found for org/nope")
    event = NodeEvent.objects.get(node=node, kind="model.failed")
    assert "Model not found" in event.message
    assert "404 Repository Not Found" in event.message
    assert not NodeModel.objects.filter(model_id="org/nope").exists()


def test_endpoint_start_from_the_commands_tab_makes_the_same_endpoint_record(cluster, register_node, owner):
    a = register_node(cluster, "a")
    cache(a, LLAMA)
    (command,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="endpoint.start", payload={"model_id": LLAMA.model_id}, node=a
    )
    slug = command.payload["endpoint_id"]
    assert re.fullmatch(r"[0-9a-f]{12}", slug)
    endpoint = Endpoint.objects.get(slug=slug)
    assert (endpoint.node_id, endpoint.model_id, endpoint.status, endpoint.start_command_id) == (
        a.pk,
        LLAMA.model_id,
        EndpointStatus.PENDING,
        command.pk,
    )
    agent_side.ack(command)
    agent_side.result(command, port=8123)
    endpoint.refresh_from_db()
    assert (endpoint.status, endpoint.port) == (EndpointStatus.RUNNING, 8123)
    # stopped, then started again from the Commands tab with its id: the same row, pending once more
    workloads.endpoint_stop(actor=owner, endpoint=endpoint)
    agent_side.result(Command.objects.get(pk=Endpoint.objects.get(pk=endpoint.pk).stop_command_id))
    (again,) = services.command_dispatch(
        actor=owner,
        cluster=cluster,
        command_type="endpoint.start",
        payload={"endpoint_id": slug, "model_id": LLAMA.model_id},
        node=a,
    )
    endpoint.refresh_from_db()
    assert (endpoint.status, endpoint.start_command_id, endpoint.port) == (EndpointStatus.PENDING, again.pk, 0)
    assert Endpoint.objects.count() == 1


def test_endpoint_start_commands_refuse_fan_out_and_foreign_ids(cluster, register_node, owner):
    register_node(cluster, "a")
    register_node(cluster, "b")
    with pytest.raises(ValidationError) as exc:
        services.command_dispatch(
            actor=owner, cluster=cluster, command_type="endpoint.start", payload={"model_id": LLAMA.model_id}
        )
    assert "one node" in str(exc.value)
    with pytest.raises(ValidationError) as exc:
        services.command_dispatch(
            actor=owner,
            cluster=cluster,
            command_type="endpoint.start",
            payload={"endpoint_id": "not-an-id", "model_id": LLAMA.model_id},
        )
    assert "12 hex digits" in str(exc.value)
    assert not Endpoint.objects.exists()
    assert not Command.objects.exists()

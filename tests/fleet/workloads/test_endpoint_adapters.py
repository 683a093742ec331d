"""LoRA adapters on the control plane (real database; the agent's frames played by `tests.fleet.agent_side`):
workspace objects validated, attached to endpoints that run with --enable-lora, one load per running replica and
the adapters carried by every later start, outcomes kept per replica, detach → unloads, the API (400, 403, 404,
409), the proxy's route sending a request naming an adapter to a replica holding it, and each start's phases
on the endpoint's log, page and /metrics."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.urls import reverse
from prometheus_client import REGISTRY

from agent import protocol
from fleet import services
from fleet.models import Command
from fleet.proxy import endpoint_routes
from fleet.workloads import services as workloads
from fleet.workloads.models import EndpointEvent, EndpointReplica, NodeModel
from fleet.workloads.services.endpoints.cold_starts import start_phase_durations
from kernel.exceptions import IllegalTransition
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db

TINY = protocol.CachedModel(model_id="acme/tiny", revision="main", path="/cache/main", size_bytes=5)
LORA = ["--enable-lora", "--max-lora-rank", "8"]


@pytest.fixture
def nodes(cluster, register_node):
    made = [register_node(cluster, name) for name in ("a", "b")]
    for node in made:
        agent_side.inventory(node, models=[TINY])
    return made


def start_all(endpoint, *, adapters=()):
    for port, replica in enumerate(EndpointReplica.objects.filter(endpoint=endpoint), start=8001):
        agent_side.result(replica.start_command, port=port, adapters=list(adapters))
    endpoint.refresh_from_db()
    return endpoint


@pytest.fixture
def running(nodes, cluster, owner):
    endpoint = workloads.endpoint_create(
        actor=owner, cluster=cluster, model_id="acme/tiny", min_replicas=2, server_args=LORA
    )
    return start_all(endpoint)


@pytest.fixture
def tone(owner, workspace):
    return workloads.lora_adapter_create(actor=owner, workspace=workspace, name="tone", model_id="acme/tone-lora")


def adapter_commands(kind: str) -> list[Command]:
    return list(Command.objects.filter(command_type=f"endpoint.adapter.{kind}").order_by("created_at", "pk"))


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"name": "x"}, "model_id"),  # neither a repository nor a path
        ({"name": "x", "model_id": "acme/a", "path": "/srv/a"}, "model_id"),  # both
        ({"name": "has space", "model_id": "acme/a"}, "name"),
        ({"name": "x", "path": "relative/a"}, "path"),
        ({"name": "x", "path": "/srv/../etc"}, "path"),
        ({"name": "x", "model_id": "not a repo"}, "model_id"),
    ],
)
def test_an_adapter_that_cannot_be_one_is_refused_with_the_field(owner, workspace, fields, where):
    with pytest.raises(ValidationError) as refused:
        workloads.lora_adapter_create(actor=owner, workspace=workspace, **fields)
    assert where in refused.value.message_dict


def test_names_are_unique_per_workspace_and_viewers_add_none(owner, workspace, tone, member_of):
    with pytest.raises(ValidationError, match="already"):
        workloads.lora_adapter_create(actor=owner, workspace=workspace, name="tone", path="/srv/tone")
    viewer = member_of(workspace, "viewer")
    with pytest.raises(PermissionDenied, match="Owners, Admins and Members can add LoRA adapters"):
        workloads.lora_adapter_create(actor=viewer, workspace=workspace, name="v", path="/srv/v")


def test_attaching_needs_lora_on_then_loads_on_each_running_replica(nodes, cluster, owner, tone):
    plain = start_all(workloads.endpoint_create(actor=owner, cluster=cluster, model_id="acme/tiny"))
    with pytest.raises(IllegalTransition, match="--enable-lora"):
        workloads.endpoint_adapter_attach(actor=owner, endpoint=plain, adapter=tone)
    assert adapter_commands("load") == []

    lora = start_all(
        workloads.endpoint_create(actor=owner, cluster=cluster, model_id="acme/tiny", min_replicas=2, server_args=LORA)
    )
    workloads.endpoint_adapter_attach(actor=owner, endpoint=lora, adapter=tone)
    loads = adapter_commands("load")
    replicas = list(EndpointReplica.objects.filter(endpoint=lora))
    assert sorted(c.payload["endpoint_id"] for c in loads) == sorted(r.server_id for r in replicas)
    assert {c.node_id for c in loads} == {r.node_id for r in replicas}
    assert loads[0].payload["adapter"] == {"name": "tone", "model_id": "acme/tone-lora", "revision": "main", "path": ""}
    workloads.endpoint_adapter_attach(actor=owner, endpoint=lora, adapter=tone)  # attached already: nothing more
    assert len(adapter_commands("load")) == 2

    # the agents report: one loaded, one failed (its log says why), the route sends "tone" to the holder only
    agent_side.result(loads[0], endpoint_id=loads[0].payload["endpoint_id"], name="tone", status="loaded")
    agent_side.error(loads[1], "adapter_failed", "the endpoint server refused to load adapter tone (500)")
    held = {r.server_id: r.adapters for r in EndpointReplica.objects.filter(endpoint=lora)}
    assert held == {loads[0].payload["endpoint_id"]: ["tone"], loads[1].payload["endpoint_id"]: []}
    failed = EndpointEvent.objects.get(endpoint=lora, kind="endpoint.adapter_failed")
    assert "refused to load adapter tone" in failed.message
    endpoint_routes.forget_routes()
    route = endpoint_routes._load_route(lora.slug)
    assert route.adapters == {"tone": (tone.pk, frozenset({loads[0].payload["endpoint_id"]}))}
    target = endpoint_routes._target(route, {"query_string": b""}, "/v1/models", caller_may_view=True)
    assert target.adapters == route.adapters


def test_later_starts_carry_the_adapters_and_detach_unloads(running, owner, tone, workspace):
    workloads.endpoint_adapter_attach(actor=owner, endpoint=running, adapter=tone)
    for load in adapter_commands("load"):
        agent_side.result(load, name="tone", status="loaded")
    assert all(r.adapters == ["tone"] for r in EndpointReplica.objects.filter(endpoint=running))
    with pytest.raises(IllegalTransition, match="detach"):
        workloads.lora_adapter_delete(actor=owner, adapter=tone)

    workloads.endpoint_stop(actor=owner, endpoint=running)
    for replica in EndpointReplica.objects.filter(endpoint=running):
        agent_side.result(replica.stop_command, endpoint_id=replica.server_id, status="stopped")
    workloads.endpoint_restart(actor=owner, endpoint=running)
    starts = [r.start_command for r in EndpointReplica.objects.filter(endpoint=running)]
    assert [s.payload["adapters"] for s in starts] == [[tone.ref().__dict__]] * 2
    # a start that reports the adapters loaded needs no load command
    start_all(running, adapters=["tone"])
    assert len(adapter_commands("load")) == 2

    workloads.endpoint_adapter_detach(actor=owner, endpoint=running, adapter=tone)
    unloads = adapter_commands("unload")
    assert [c.payload["name"] for c in unloads] == ["tone", "tone"]
    for unload in unloads:
        agent_side.result(unload, name="tone", status="unloaded")
    assert all(r.adapters == [] for r in EndpointReplica.objects.filter(endpoint=running))
    workloads.lora_adapter_delete(actor=owner, adapter=tone)
    # an endpoint without adapters sends none: an agent that predates the field reads its start as before
    workloads.endpoint_stop(actor=owner, endpoint=running)
    for replica in EndpointReplica.objects.filter(endpoint=running):
        agent_side.result(replica.stop_command, endpoint_id=replica.server_id, status="stopped")
    workloads.endpoint_restart(actor=owner, endpoint=running)
    assert all(
        "adapters" not in r.start_command.payload and "download" not in r.start_command.payload
        for r in EndpointReplica.objects.filter(endpoint=running)
    )


def test_a_replica_starting_while_an_adapter_is_attached_loads_it_once_it_runs(nodes, cluster, owner, tone):
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id="acme/tiny", server_args=LORA)
    workloads.endpoint_adapter_attach(actor=owner, endpoint=endpoint, adapter=tone)  # before it runs
    assert adapter_commands("load") == []
    (replica,) = EndpointReplica.objects.filter(endpoint=endpoint)
    agent_side.result(replica.start_command, port=8001, adapters=[])  # its start predates the attach
    (load,) = adapter_commands("load")
    assert (load.payload["endpoint_id"], load.payload["adapter"]["name"]) == (replica.server_id, "tone")
    assert load.created_by is None  # the control plane's own command


def test_the_api_adds_attaches_and_refuses(running, owner, workspace, other_workspace, member_of, api_client_for):
    api = api_client_for(owner)
    bad = api.post("/api/v1/adapters/", {"workspace": str(workspace.pk), "name": "x"}, format="json")
    assert bad.status_code == 400
    assert "model_id" in bad.json()
    made = api.post(
        "/api/v1/adapters/",
        {"workspace": str(workspace.pk), "name": "tone", "model_id": "acme/tone-lora"},
        format="json",
    )
    assert made.status_code == 201, made.content
    adapter_id = made.json()["id"]
    attached = api.post(f"/api/v1/adapters/{adapter_id}/attach/", {"endpoint": str(running.pk)}, format="json")
    assert attached.status_code == 200, attached.content
    assert attached.json()["endpoints"] == [str(running.pk)]
    assert len(adapter_commands("load")) == 2
    assert api.delete(f"/api/v1/adapters/{adapter_id}/").status_code == 409  # attached
    viewer = api_client_for(member_of(workspace, "viewer"))
    assert viewer.get("/api/v1/adapters/").json()["results"][0]["name"] == "tone"
    assert viewer.post(f"/api/v1/adapters/{adapter_id}/detach/", {"endpoint": str(running.pk)}).status_code == 403
    stranger = api_client_for(other_workspace.memberships.first().user)
    assert stranger.get(f"/api/v1/adapters/{adapter_id}/").status_code == 404
    assert api.post(f"/api/v1/adapters/{adapter_id}/detach/", {"endpoint": str(running.pk)}).status_code == 200
    assert api.delete(f"/api/v1/adapters/{adapter_id}/").status_code == 204
    replica_json = api.get(f"/api/v1/endpoints/{running.pk}/").json()["replicas"][0]
    assert replica_json["adapters"] == []


def _histogram(phase: str, weights: str) -> float:
    value = REGISTRY.get_sample_value(
        "cleverthis_endpoint_start_phase_seconds_count", {"phase": phase, "weights": weights}
    )
    return value or 0.0


def test_each_start_explains_its_phases_on_the_log_page_and_metrics(nodes, cluster, owner, client):
    before = _histogram("total", "downloaded"), _histogram("model_loaded", "downloaded")
    (start,) = services.command_dispatch(
        actor=owner,
        cluster=cluster,
        command_type="endpoint.start",
        payload={"endpoint_id": "00aa11bb22cc", "model_id": "acme/cold", "download": True},
        node=nodes[0],
    )
    assert start.payload["download"] is True
    phases = {
        "weights": "downloaded",
        "weights_bytes": 3 * 1024 * 1024,
        "weights_s": 4.0,
        "server_started_s": 4.5,
        "model_loaded_s": 20.0,
        "healthy_s": 21.0,
    }
    agent_side.result(start, port=8010, phases=phases)
    event = EndpointEvent.objects.get(kind="endpoint.start_phases")
    assert event.data["phases"] == {
        "placed": event.data["phases"]["placed"],
        "weights": 4.0,
        "server_started": 0.5,
        "model_loaded": 15.5,
        "healthy": 1.0,
        "total": pytest.approx(21.0 + event.data["phases"]["placed"]),
    }
    assert event.data["weights_bytes"] == 3 * 1024 * 1024
    assert event.message.startswith("Replica 00aa11bb22cc cold start in ")
    assert "weights downloaded (3.0 MiB) 4.0 s" in event.message
    assert NodeModel.objects.filter(node=nodes[0], model_id="acme/cold").exists()  # placement counts it now
    assert (_histogram("total", "downloaded"), _histogram("model_loaded", "downloaded")) == (
        before[0] + 1,
        before[1] + 1,
    )
    client.force_login(owner)
    page = client.get(reverse("workloads:endpoint_detail", args=[event.endpoint_id])).content.decode()
    assert "Starts explained" in page
    assert "15.5 s" in page
    assert "downloaded (3.0 MiB)" in page


def test_phase_durations_are_each_phases_own_time():
    phases = protocol.StartPhases(
        weights="present", weights_s=0.2, server_started_s=0.3, model_loaded_s=10, healthy_s=12, adapters_s=12.5
    )
    assert start_phase_durations(1.5, phases) == {
        "placed": 1.5,
        "weights": 0.2,
        "server_started": 0.1,
        "model_loaded": 9.7,
        "healthy": 2.0,
        "adapters": 0.5,
        "total": 14.0,
    }

"""Scale to zero: validation of min_replicas 0 and idle_timeout_s, the idle pass (out of rotation now,
stopped after the drain), the idle status only for endpoints the pass put to sleep, waking (idempotent, a
draining replica brought back), quotas (an idle endpoint keeps its place, a cold start is admitted)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from agent import protocol
from fleet.proxy import endpoint_routes
from fleet.workloads import services as workloads
from fleet.workloads.models import Endpoint, EndpointEvent, EndpointReplica, EndpointStatus
from fleet.workloads.tasks import endpoints_heal_tick, endpoints_idle_tick
from kernel.exceptions import QuotaExceeded
from tenancy import services as tenancy_services
from tenancy.quotas import usage
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db

LLAMA = protocol.CachedModel(model_id="meta-llama/Llama-3.2-1B", revision="main", path="/cache/llama", size_bytes=5)


@pytest.fixture(autouse=True)
def _empty_route_cache():
    endpoint_routes.forget_routes()
    yield
    endpoint_routes.forget_routes()


def running_endpoint(cluster, owner, **fields) -> Endpoint:
    """An endpoint that scales to zero, its one replica running."""
    endpoint = workloads.endpoint_create(
        actor=owner, cluster=cluster, model_id=LLAMA.model_id, **{"min_replicas": 0, "idle_timeout_s": 60, **fields}
    )
    (replica,) = EndpointReplica.objects.filter(endpoint=endpoint)
    agent_side.result(replica.start_command, port=8001)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.RUNNING
    return endpoint


def quiet_for(endpoint: Endpoint, seconds: float) -> None:
    """As if its last request and its replica's start were `seconds` ago."""
    then = timezone.now() - timedelta(seconds=seconds)
    Endpoint.objects.filter(pk=endpoint.pk).update(last_request_at=then)
    EndpointReplica.objects.filter(endpoint=endpoint).update(updated_at=then)


@pytest.fixture
def model_node(node):
    agent_side.inventory(node, models=[LLAMA])
    return node


# ---- validation


def test_min_replicas_zero_starts_one_replica_and_keeps_the_idle_timeout(model_node, cluster, owner):
    endpoint = workloads.endpoint_create(
        actor=owner, cluster=cluster, model_id=LLAMA.model_id, min_replicas=0, idle_timeout_s=90
    )
    assert (endpoint.min_replicas, endpoint.max_replicas, endpoint.idle_timeout_s) == (0, 1, 90)
    assert [r.status for r in endpoint.replicas.all()] == [EndpointStatus.PENDING]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"min_replicas": 0, "idle_timeout_s": 0}, "idle_timeout_s"),
        ({"min_replicas": 0, "max_replicas": 0}, "max_replicas"),
        ({"min_replicas": 0, "idle_timeout_s": -5}, "idle_timeout_s"),
        ({"min_replicas": 0, "idle_timeout_s": "soon"}, "idle_timeout_s"),
    ],
)
def test_bad_scale_to_zero_settings_name_the_field(model_node, cluster, owner, fields, field):
    with pytest.raises(ValidationError) as refused:
        workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, **fields)
    assert field in refused.value.message_dict
    assert not Endpoint.objects.exists()


def test_the_database_refuses_scale_to_zero_without_an_idle_timeout(model_node, cluster, owner):
    endpoint = running_endpoint(cluster, owner)
    with pytest.raises(IntegrityError), transaction.atomic():
        Endpoint.objects.filter(pk=endpoint.pk).update(idle_timeout_s=0)
    Endpoint.objects.filter(pk=endpoint.pk).update(min_replicas=1, idle_timeout_s=0)  # kept replicas: no timeout


def test_the_api_creates_a_scale_to_zero_endpoint(api_client_for, model_node, cluster, owner):
    payload = {"cluster": str(cluster.pk), "model_id": LLAMA.model_id, "min_replicas": 0, "idle_timeout_s": 120}
    response = api_client_for(owner).post("/api/v1/endpoints/", payload, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["min_replicas"], body["max_replicas"], body["idle_timeout_s"], body["idle_since"]) == (0, 1, 120, None)


# ---- the idle pass


def test_a_quiet_endpoint_scales_to_zero_and_its_replica_drains_before_it_stops(model_node, cluster, owner, settings):
    endpoint = running_endpoint(cluster, owner)
    (replica,) = endpoint.replicas.all()
    quiet_for(endpoint, 30)
    assert endpoints_idle_tick() == []  # 30 s of a 60 s timeout
    quiet_for(endpoint, 61)
    assert endpoints_idle_tick() == [str(endpoint.pk)]
    endpoint.refresh_from_db()
    replica.refresh_from_db()
    assert (endpoint.status, endpoint.get_status_display()) == (EndpointStatus.IDLE, "Scaled to zero")
    assert endpoint.idle_since is not None
    assert (replica.status, replica.retired_at is not None) == (EndpointStatus.RUNNING, True)  # still draining
    assert endpoint_routes._load_route(endpoint.slug).replicas == ()  # out of rotation at once
    event = endpoint.events.get(kind="endpoint.scaled_to_zero")
    assert "scaled to zero after 61 s without requests" in event.message
    assert endpoints_idle_tick() == []  # asleep: nothing more to do

    settings.ENDPOINT_DRAIN_S = 3600
    endpoints_heal_tick()
    replica.refresh_from_db()
    assert replica.status == EndpointStatus.RUNNING  # still finishing what it serves
    settings.ENDPOINT_DRAIN_S = 0
    assert endpoints_heal_tick() == {str(endpoint.pk): 0}  # drained: it stops now, nothing replaces it
    replica.refresh_from_db()
    assert (replica.status, replica.stop_command.node_id) == (EndpointStatus.STOPPING, model_node.pk)
    agent_side.result(replica.stop_command)
    replica.refresh_from_db()
    endpoint.refresh_from_db()
    assert (replica.status, endpoint.status) == (EndpointStatus.STOPPED, EndpointStatus.IDLE)
    assert endpoints_heal_tick() == {}
    assert EndpointReplica.objects.filter(endpoint=endpoint).count() == 1


def test_the_last_request_keeps_it_awake_and_kept_replicas_never_idle(model_node, cluster, owner, register_node):
    endpoint = running_endpoint(cluster, owner)
    quiet_for(endpoint, 600)
    Endpoint.objects.filter(pk=endpoint.pk).update(last_request_at=timezone.now() - timedelta(seconds=5))
    assert endpoints_idle_tick() == []
    kept = running_endpoint(cluster, owner, min_replicas=1)
    quiet_for(kept, 600)
    assert str(kept.pk) not in endpoints_idle_tick()
    kept.refresh_from_db()
    assert kept.status == EndpointStatus.RUNNING


def test_a_stopped_endpoint_reads_stopped_not_idle(model_node, cluster, owner):
    endpoint = running_endpoint(cluster, owner)
    workloads.endpoint_stop(actor=owner, endpoint=endpoint)
    agent_side.result(endpoint.replicas.get().stop_command)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.STOPPED
    # and one stopped while asleep stops for good: no request wakes it
    other = running_endpoint(cluster, owner)
    quiet_for(other, 61)
    endpoints_idle_tick()
    workloads.endpoint_stop(actor=owner, endpoint=other)
    other.refresh_from_db()
    assert (other.status, other.idle_since) == (EndpointStatus.STOPPING, None)  # its draining replica stops
    agent_side.result(other.replicas.get().stop_command)
    other.refresh_from_db()
    assert other.status == EndpointStatus.STOPPED
    assert workloads.endpoint_wake(endpoint_id=other.pk) is None


# ---- waking


def asleep(cluster, owner, settings) -> Endpoint:
    """An endpoint scaled to zero whose replica has stopped."""
    endpoint = running_endpoint(cluster, owner)
    quiet_for(endpoint, 61)
    endpoints_idle_tick()
    settings.ENDPOINT_DRAIN_S = 0
    endpoints_heal_tick()
    agent_side.result(endpoint.replicas.get().stop_command)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.IDLE
    return endpoint


def test_waking_starts_one_replica_once(model_node, cluster, owner, settings):
    endpoint = asleep(cluster, owner, settings)
    replica = workloads.endpoint_wake(endpoint_id=endpoint.pk)
    assert replica is not None
    assert workloads.endpoint_wake(endpoint_id=endpoint.pk) is None  # woken already: nothing more
    replica.refresh_from_db()
    endpoint.refresh_from_db()
    assert (replica.server_id, replica.status, replica.retired_at) == (endpoint.slug, EndpointStatus.PENDING, None)
    assert (endpoint.status, endpoint.idle_since) == (EndpointStatus.PENDING, None)  # the page reads starting
    assert endpoint.events.filter(kind="endpoint.cold_start").count() == 1
    assert "cold start: woken by a request" in endpoint.events.get(kind="endpoint.cold_start").message
    agent_side.ack(replica.start_command)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.STARTING
    agent_side.result(replica.start_command, port=8002)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.RUNNING
    assert [u.port for u in endpoint_routes._load_route(endpoint.slug).replicas] == [8002]


def test_a_replica_still_draining_comes_back_without_a_start(model_node, cluster, owner, settings):
    settings.ENDPOINT_DRAIN_S = 3600
    endpoint = running_endpoint(cluster, owner)
    quiet_for(endpoint, 61)
    endpoints_idle_tick()
    replica = workloads.endpoint_wake(endpoint_id=endpoint.pk)
    endpoint.refresh_from_db()
    assert (replica.status, replica.retired_at, endpoint.status) == (EndpointStatus.RUNNING, None, "running")
    assert replica.stop_command is None
    assert [u.port for u in endpoint_routes._load_route(endpoint.slug).replicas] == [8001]


# ---- quotas


# vLLM's 0.05 of the test node's 80,000 MB GPU (4,000 MB) is less than the 4,096 MB asked: each holds 4 GiB.
SMALL_SHARE = ["--gpu-memory-utilization", "0.05"]


def test_an_idle_endpoint_keeps_its_place_but_frees_its_gpus_and_a_cold_start_is_admitted(
    model_node, cluster, owner, workspace, settings
):
    tenancy_services.workspace_quota_set(actor=owner, workspace=workspace, limits={"endpoints": 1, "vram_gib": 4})
    endpoint = workloads.endpoint_create(
        actor=owner,
        cluster=cluster,
        model_id=LLAMA.model_id,
        min_replicas=0,
        idle_timeout_s=60,
        min_vram_mb=4096,
        server_args=SMALL_SHARE,
    )
    agent_side.result(endpoint.replicas.get().start_command, port=8001)
    quiet_for(endpoint, 61)
    endpoints_idle_tick()
    settings.ENDPOINT_DRAIN_S = 0
    endpoints_heal_tick()
    agent_side.result(endpoint.replicas.get().stop_command)
    in_use = usage([workspace.pk])[workspace.pk]
    assert (in_use["endpoints"], in_use["vram_gib"]) == (1, 0)  # idle: counted, holding no VRAM
    with pytest.raises(QuotaExceeded) as refused:
        workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id)
    assert refused.value.quota == "endpoints"
    # another endpoint takes the VRAM meanwhile: the cold start is refused and the endpoint stays asleep
    tenancy_services.workspace_quota_set(actor=owner, workspace=workspace, limits={"endpoints": 2, "vram_gib": 4})
    workloads.endpoint_create(
        actor=owner, cluster=cluster, model_id=LLAMA.model_id, min_vram_mb=4096, server_args=SMALL_SHARE
    )
    with pytest.raises(QuotaExceeded) as refused:
        workloads.endpoint_wake(endpoint_id=endpoint.pk)
    assert refused.value.quota == "vram_gib"
    endpoint.refresh_from_db()
    assert (endpoint.status, endpoint.idle_since is not None) == (EndpointStatus.IDLE, True)
    assert not EndpointEvent.objects.filter(endpoint=endpoint, kind="endpoint.cold_start").exists()
    tenancy_services.workspace_quota_set(actor=owner, workspace=workspace, limits={"endpoints": 2, "vram_gib": 8})
    assert workloads.endpoint_wake(endpoint_id=endpoint.pk) is not None  # admitted: asks VRAM, not an endpoint
    assert usage([workspace.pk])[workspace.pk]["vram_gib"] == 8


# ---- pages


def test_the_cluster_tab_creates_a_scale_to_zero_endpoint_and_shows_it_scaled_to_zero(
    client, model_node, cluster, owner, settings
):
    client.force_login(owner)
    tab = f"/compute/clusters/{cluster.pk}/endpoints/"
    assert "New endpoint" in client.get(tab).content.decode()
    form = {"model_id": LLAMA.model_id, "revision": "main", "gpus": 0, "min_vram_mb": 0, "min_replicas": 0}
    refused = client.post(f"{tab}new/", {**form, "idle_timeout_s": 0})
    assert refused.status_code == 400
    assert "Ensure this value is greater than or equal to 1" in refused.content.decode()
    assert not Endpoint.objects.exists()
    assert client.post(f"{tab}new/", {**form, "idle_timeout_s": 60}).status_code == 302
    endpoint = Endpoint.objects.get()
    assert (endpoint.min_replicas, endpoint.max_replicas, endpoint.idle_timeout_s) == (0, 1, 60)
    agent_side.result(endpoint.replicas.get().start_command, port=8001)
    assert "scales to zero after 60 s idle" in client.get(tab).content.decode()
    quiet_for(endpoint, 61)
    endpoints_idle_tick()
    page = client.get(tab).content.decode()
    assert "Scaled to zero" in page
    assert "starts on the next request" in page
    settings.ENDPOINT_DRAIN_S = 0
    endpoints_heal_tick()
    agent_side.result(endpoint.replicas.get().stop_command)
    workloads.endpoint_wake(endpoint_id=endpoint.pk)
    assert "starting: requests wait for it" in client.get(tab).content.decode()


def test_viewers_cannot_create_endpoints_from_the_page(client, model_node, cluster, workspace, member_of):
    client.force_login(member_of(workspace, "viewer"))
    tab = f"/compute/clusters/{cluster.pk}/endpoints/"
    assert "New endpoint" not in client.get(tab).content.decode()
    form = {"model_id": LLAMA.model_id, "revision": "main", "gpus": 0, "min_vram_mb": 0, "min_replicas": 0}
    assert client.post(f"{tab}new/", {**form, "idle_timeout_s": 60}).status_code == 403
    assert not Endpoint.objects.exists()


def test_the_cluster_tab_sets_the_scaling_targets_and_server_arguments(client, model_node, cluster, owner):
    client.force_login(owner)
    tab = f"/compute/clusters/{cluster.pk}/endpoints/"
    form = {"model_id": LLAMA.model_id, "revision": "main", "gpus": 0, "min_vram_mb": 0, "min_replicas": 1}
    form |= {"max_replicas": 3, "idle_timeout_s": 300, "target_in_flight": 8, "scale_cooldown_s": 30}
    refused = client.post(f"{tab}new/", {**form, "server_args": "--max-model-len '2048"})
    assert refused.status_code == 400
    assert "check the quotes" in refused.content.decode()
    assert client.post(f"{tab}new/", {**form, "server_args": "--max-model-len 2048"}).status_code == 302
    endpoint = Endpoint.objects.get()
    assert (endpoint.target_in_flight, endpoint.scale_cooldown_s, endpoint.max_replicas) == (8, 30, 3)
    assert endpoint.server_args == ["--max-model-len", "2048"]
    assert endpoint.replicas.get().start_command.payload["extra_args"] == ["--max-model-len", "2048"]

"""The endpoints' autoscaler: replicas follow the load (requests per minute, requests in flight, tokens per
second; the largest ask) between min and max, a change waits for the cool-down, each change is an event
saying why with every metric's figures; endpoints without a target or not running are left alone."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db.models import F
from django.utils import timezone

from agent import protocol
from fleet.models import NodeEvent
from fleet.proxy import endpoint_routes
from fleet.replica_load import LoadPublisher, ReplicaLoad
from fleet.workloads import services as workloads
from fleet.workloads.models import Endpoint, EndpointEvent, EndpointReplica, EndpointStatus
from fleet.workloads.tasks import endpoints_autoscale_tick, endpoints_heal_tick
from tenancy import services as tenancy_services
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db

LLAMA = protocol.CachedModel(model_id="meta-llama/Llama-3.2-1B", revision="main", path="/cache/llama", size_bytes=5)


@pytest.mark.parametrize(
    ("rate", "target", "wanted"),
    [(0, 60, 1), (60, 60, 1), (61, 60, 2), (300, 60, 3), (10_000, 60, 3), (5, 0, 1)],
)
def test_the_replicas_wanted_follow_the_rate_within_min_and_max(rate, target, wanted):
    assert workloads.desired_replicas(rate_per_min=rate, target=target, minimum=1, maximum=3) == wanted


def served(endpoint, requests: int) -> None:
    """`requests` more forwarded requests, as the proxies write them."""
    Endpoint.objects.filter(pk=endpoint.pk).update(request_count=F("request_count") + requests)


def serving(endpoint) -> list[EndpointReplica]:
    live = [EndpointStatus.PENDING, EndpointStatus.STARTING, EndpointStatus.RUNNING]
    return list(EndpointReplica.objects.filter(endpoint=endpoint, status__in=live).order_by("created_at"))


def test_scale_up_on_load_hold_through_the_cool_down_then_scale_down(cluster, register_node, owner, settings):
    nodes = [register_node(cluster, name) for name in ("a", "b", "c")]
    for node in nodes:
        agent_side.inventory(node, models=[LLAMA])
    endpoint = workloads.endpoint_create(
        actor=owner,
        cluster=cluster,
        model_id=LLAMA.model_id,
        min_replicas=1,
        max_replicas=3,
        target_requests_per_min=60,
        scale_cooldown_s=100,
    )
    (first,) = serving(endpoint)
    agent_side.result(first.start_command, port=8001)
    t0 = timezone.now()
    assert workloads.endpoint_autoscale(endpoint_id=endpoint.pk, now=t0) is None  # the first sample

    served(endpoint, 300)
    up = workloads.endpoint_autoscale(endpoint_id=endpoint.pk, now=t0 + timedelta(seconds=60))
    assert (up.replicas, up.wanted, round(up.rate_per_min), up.changed) == (1, 3, 300, 2)
    now_serving = serving(endpoint)
    assert len({r.node_id for r in now_serving}) == 3  # the new ones on nodes of their own
    events = NodeEvent.objects.filter(kind="endpoint.scaled")
    assert events.count() == 2
    assert all("scaled 1 → 3: 300 requests/min over 1 replica(s), target 60/min each" in e.message for e in events)
    logged = EndpointEvent.objects.filter(endpoint=endpoint, kind="endpoint.scaled")
    assert sorted(e.node_id for e in logged) == sorted(r.node_id for r in serving(endpoint)[1:])
    assert all(e.message == events[0].message for e in logged)  # the decision and its figures, on the endpoint
    for port, replica in enumerate(now_serving[1:], start=8002):
        agent_side.result(replica.start_command, port=port)

    held = workloads.endpoint_autoscale(endpoint_id=endpoint.pk, now=t0 + timedelta(seconds=120))
    assert (held.wanted, held.changed) == (1, 0)
    assert "cool-down" in held.reason
    down = workloads.endpoint_autoscale(endpoint_id=endpoint.pk, now=t0 + timedelta(seconds=200))
    assert (down.replicas, down.wanted, down.changed) == (3, 1, -2)
    # the newest two leave rotation at once and keep running while their requests finish (the drain) ...
    retired = EndpointReplica.objects.filter(endpoint=endpoint, retired_at__isnull=False)
    assert sorted(r.server_id for r in retired) == sorted(r.server_id for r in now_serving[1:])
    assert {r.status for r in retired} == {EndpointStatus.RUNNING}
    endpoint_routes.forget_routes()
    assert [u.key for u in endpoint_routes._load_route(endpoint.slug).replicas] == [first.server_id]
    settings.ENDPOINT_DRAIN_S = 3600
    assert endpoints_heal_tick() == {}  # still draining
    # ... and are stopped by the healing pass once drained
    settings.ENDPOINT_DRAIN_S = 0
    endpoints_heal_tick()
    assert EndpointReplica.objects.filter(endpoint=endpoint, status=EndpointStatus.STOPPING).count() == 2
    assert [r.server_id for r in serving(endpoint) if r.status == EndpointStatus.RUNNING] == [first.server_id]
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.RUNNING


def test_endpoints_without_a_target_or_not_running_are_left_alone(cluster, node, owner):
    agent_side.inventory(node, models=[LLAMA])
    plain = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, max_replicas=2)
    agent_side.result(plain.start_command, port=8001)
    starting = workloads.endpoint_create(
        actor=owner, cluster=cluster, model_id=LLAMA.model_id, max_replicas=2, target_requests_per_min=1
    )
    served(plain, 1000)
    served(starting, 1000)
    assert workloads.endpoints_to_autoscale() == []
    assert endpoints_autoscale_tick() == {}
    assert workloads.endpoint_autoscale(endpoint_id=plain.pk) is None
    assert workloads.endpoint_autoscale(endpoint_id=starting.pk) is None
    assert EndpointReplica.objects.count() == 2


def test_the_beat_scales_every_autoscaled_endpoint(cluster, register_node, owner):
    for name in ("a", "b"):
        agent_side.inventory(register_node(cluster, name), models=[LLAMA])
    endpoint = workloads.endpoint_create(
        actor=owner, cluster=cluster, model_id=LLAMA.model_id, max_replicas=2, target_requests_per_min=10
    )
    agent_side.result(endpoint.start_command, port=8001)
    assert endpoints_autoscale_tick() == {}  # the first sample
    Endpoint.objects.filter(pk=endpoint.pk).update(load_sample_at=timezone.now() - timedelta(seconds=30))
    served(endpoint, 100)
    assert endpoints_autoscale_tick() == {str(endpoint.pk): 1}


def test_scale_up_stops_at_the_workspaces_quota_and_says_why(cluster, register_node, owner, workspace):
    for name in ("a", "b", "c"):
        agent_side.inventory(register_node(cluster, name), models=[LLAMA])
    tenancy_services.workspace_quota_set(actor=owner, workspace=workspace, limits={"vram_gib": 8})
    endpoint = workloads.endpoint_create(
        actor=owner,
        cluster=cluster,
        model_id=LLAMA.model_id,
        min_vram_mb=4096,  # what each holds: vLLM's 0.05 of the node's 80,000 MB GPU is less
        server_args=["--gpu-memory-utilization", "0.05"],
        max_replicas=3,
        target_requests_per_min=60,
    )
    (first,) = serving(endpoint)
    agent_side.result(first.start_command, port=8001)
    t0 = timezone.now()
    workloads.endpoint_autoscale(endpoint_id=endpoint.pk, now=t0)
    served(endpoint, 300)
    up = workloads.endpoint_autoscale(endpoint_id=endpoint.pk, now=t0 + timedelta(seconds=60))
    assert (up.wanted, up.changed) == (3, 1)  # 4 GiB each: the quota holds two replicas
    assert "stopped at the workspace's quota" in up.reason
    assert "VRAM is limited to 8 GiB" in up.reason
    assert len(serving(endpoint)) == 2
    assert EndpointReplica.objects.filter(endpoint=endpoint).count() == 2  # the refused one left no row


def load_endpoint(cluster, register_node, owner, *, nodes: int = 3, **targets):
    """A running autoscaled endpoint (one replica, up to `nodes`) on `nodes` nodes holding the model."""
    for name in "abcdefgh"[:nodes]:
        agent_side.inventory(register_node(cluster, name), models=[LLAMA])
    endpoint = workloads.endpoint_create(
        actor=owner, cluster=cluster, model_id=LLAMA.model_id, max_replicas=nodes, scale_cooldown_s=100, **targets
    )
    (first,) = serving(endpoint)
    agent_side.result(first.start_command, port=8001)
    return endpoint, first


def test_requests_in_flight_scale_up_at_once_hold_through_the_cool_down_then_down(cluster, register_node, owner):
    endpoint, first = load_endpoint(cluster, register_node, owner, target_in_flight=8)
    t0 = timezone.now()
    busy = {first.server_id: ReplicaLoad(in_flight=31), "other-endpoint": ReplicaLoad(in_flight=500)}
    up = workloads.endpoint_autoscale(endpoint_id=endpoint.pk, now=t0, loads=busy)  # no first sample needed
    assert (up.replicas, up.wanted, up.changed, up.in_flight) == (1, 3, 2, 31)  # ceil(31 / 8) = 4, max 3
    (logged, _) = EndpointEvent.objects.filter(endpoint=endpoint, kind="endpoint.scaled")
    assert "scaled 1 → 3: 31 requests in flight over 1 replica(s), target 8 each" in logged.message
    assert (logged.data["from"], logged.data["to"], logged.data["in_flight"]) == (1, 3, 31)
    for port, replica in enumerate(serving(endpoint)[1:], start=8002):
        agent_side.result(replica.start_command, port=port)

    spread = {r.server_id: ReplicaLoad(in_flight=1) for r in serving(endpoint)}
    held = workloads.endpoint_autoscale(endpoint_id=endpoint.pk, now=t0 + timedelta(seconds=50), loads=spread)
    assert (held.wanted, held.changed) == (1, 0)
    assert held.reason == "3 requests in flight over 3 replica(s), target 8 each: held by the cool-down"
    down = workloads.endpoint_autoscale(endpoint_id=endpoint.pk, now=t0 + timedelta(seconds=101), loads={})
    assert (down.replicas, down.wanted, down.changed) == (3, 1, -2)
    assert "scaled 3 → 1: 0 requests in flight over 3 replica(s), target 8 each" in down.reason
    assert EndpointEvent.objects.filter(endpoint=endpoint, kind="endpoint.scaled").count() == 4


def test_tokens_per_second_scale_and_the_largest_ask_decides(cluster, register_node, owner):
    endpoint, first = load_endpoint(cluster, register_node, owner, target_in_flight=8, target_tokens_per_s=100)
    loads = {first.server_id: ReplicaLoad(in_flight=9, tokens_per_s=250.0)}
    up = workloads.endpoint_autoscale(endpoint_id=endpoint.pk, loads=loads)
    assert (up.wanted, up.changed, up.tokens_per_s) == (3, 2, 250.0)  # tokens ask 3, in flight 2
    assert up.reason.endswith(
        "scaled 1 → 3: 250 tokens/s over 1 replica(s), target 100/s each; "
        "9 requests in flight over 1 replica(s), target 8 each"
    )
    calm = {first.server_id: ReplicaLoad(in_flight=2, tokens_per_s=90.0)}
    Endpoint.objects.filter(pk=endpoint.pk).update(scaled_at=None)
    right = workloads.endpoint_autoscale(endpoint_id=endpoint.pk, loads=calm)
    assert (right.wanted, right.changed) == (1, -2)


def test_the_requests_per_minute_target_still_waits_for_its_first_sample_with_others_on(cluster, register_node, owner):
    endpoint, first = load_endpoint(
        cluster, register_node, owner, nodes=2, target_in_flight=4, target_requests_per_min=60
    )
    loads = {first.server_id: ReplicaLoad(in_flight=6)}
    t0 = timezone.now()
    assert workloads.endpoint_autoscale(endpoint_id=endpoint.pk, now=t0, loads=loads) is None  # the first sample
    up = workloads.endpoint_autoscale(endpoint_id=endpoint.pk, now=t0 + timedelta(seconds=60), loads=loads)
    assert (up.wanted, up.changed) == (2, 1)
    assert "6 requests in flight over 1 replica(s), target 4 each; 0 requests/min over" in up.reason


def test_the_beat_reads_the_shared_figures_the_web_processes_publish(cluster, register_node, owner):
    endpoint, first = load_endpoint(cluster, register_node, owner, nodes=2, target_in_flight=2)
    assert workloads.endpoints_to_autoscale() == [endpoint.pk]
    a, b = LoadPublisher(name="test-a"), LoadPublisher(name="test-b")
    try:
        a.publish({first.server_id: (2, 0, 0.0)})
        b.publish({first.server_id: (1, 0, 0.0)})  # 3 in flight over the two processes: 2 replicas
        assert endpoints_autoscale_tick() == {str(endpoint.pk): 1}
    finally:
        a.publish({})
        b.publish({})
    (event,) = EndpointEvent.objects.filter(endpoint=endpoint, kind="endpoint.scaled")
    assert "scaled 1 → 2: 3 requests in flight over 1 replica(s), target 2 each" in event.message


@pytest.mark.parametrize(
    ("targets", "field"),
    [
        ({"target_in_flight": -1}, "target_in_flight"),
        ({"target_in_flight": 100_001}, "target_in_flight"),
        ({"target_tokens_per_s": "many"}, "target_tokens_per_s"),
        ({"target_tokens_per_s": True}, "target_tokens_per_s"),
    ],
)
def test_bad_targets_are_refused_naming_the_field(cluster, node, owner, targets, field):
    agent_side.inventory(node, models=[LLAMA])
    with pytest.raises(ValidationError) as refused:
        workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id, **targets)
    assert field in refused.value.message_dict
    assert not Endpoint.objects.exists()


def test_a_queue_that_builds_adds_replicas_and_an_empty_one_lets_them_go(cluster, register_node, owner):
    endpoint, first = load_endpoint(cluster, register_node, owner, nodes=3, target_queued=5, max_concurrency=4)
    assert workloads.endpoints_to_autoscale() == [endpoint.pk]
    a, b = LoadPublisher(name="test-qa"), LoadPublisher(name="test-qb")
    try:  # two web processes: 4 in flight (the limit) and 3 + 4 waiting
        a.publish({first.server_id: (4, 0, 0.0)}, queues={str(endpoint.pk): (3, (), 0)})
        b.publish({}, queues={str(endpoint.pk): (4, (), 2)})
        assert endpoints_autoscale_tick() == {str(endpoint.pk): 2}  # ceil(4 / 4) + ceil(7 / 5) = 3
    finally:
        a.publish({})
        b.publish({})
    (event, _) = EndpointEvent.objects.filter(endpoint=endpoint, kind="endpoint.scaled")
    assert "scaled 1 → 3: 7 requests queued (and 4 in flight at 4 each) over 1 replica(s), target 5" in event.message
    assert event.data["queued"] == 7
    Endpoint.objects.filter(pk=endpoint.pk).update(scaled_at=None)
    calm = workloads.endpoint_autoscale(
        endpoint_id=endpoint.pk, loads={first.server_id: ReplicaLoad(in_flight=3)}, queues={}
    )
    assert (calm.wanted, calm.changed, calm.queued) == (1, -2, 0)  # nothing waits: one replica serves the 3

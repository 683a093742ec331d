"""The endpoints' autoscaler: replicas follow the request rate between min and max, a change waits for the
cool-down, each change is an event saying why; endpoints without a target or not running are left alone."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.models import F
from django.utils import timezone

from agent import protocol
from cleverthis.tenancy import services as tenancy_services
from fleet.models import NodeEvent
from fleet.workloads import services as workloads
from fleet.workloads.models import Endpoint, EndpointEvent, EndpointReplica, EndpointStatus
from fleet.workloads.tasks import endpoints_autoscale_tick
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


def test_scale_up_on_load_hold_through_the_cool_down_then_scale_down(cluster, register_node, owner):
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
    assert [r.server_id for r in serving(endpoint) if r.status == EndpointStatus.RUNNING] == [first.server_id]
    assert EndpointReplica.objects.filter(endpoint=endpoint, status=EndpointStatus.STOPPING).count() == 2
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
    tenancy_services.workspace_quota_set(actor=owner, workspace=workspace, limits={"vram_gib": 2})
    endpoint = workloads.endpoint_create(
        actor=owner,
        cluster=cluster,
        model_id=LLAMA.model_id,
        min_vram_mb=1024,
        max_replicas=3,
        target_requests_per_min=60,
    )
    (first,) = serving(endpoint)
    agent_side.result(first.start_command, port=8001)
    t0 = timezone.now()
    workloads.endpoint_autoscale(endpoint_id=endpoint.pk, now=t0)
    served(endpoint, 300)
    up = workloads.endpoint_autoscale(endpoint_id=endpoint.pk, now=t0 + timedelta(seconds=60))
    assert (up.wanted, up.changed) == (3, 1)  # 1 GiB each: the quota holds two replicas
    assert "stopped at the workspace's quota" in up.reason
    assert "VRAM is limited to 2 GiB" in up.reason
    assert len(serving(endpoint)) == 2
    assert EndpointReplica.objects.filter(endpoint=endpoint).count() == 2  # the refused one left no row

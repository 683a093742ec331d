"""The endpoints' autoscaler: between `min_replicas` and `max_replicas` on their request rate.

One pass per running endpoint with a `target_requests_per_min` (the beat's `endpoints_autoscale_tick`):
the rate is measured from the requests the proxies wrote to the endpoint's `request_count` since the
previous pass (written at most every `ENDPOINT_REQUESTS_FLUSH_S` per web process, so a burst shows a
few seconds late); the replicas wanted are `ceil(rate / target)`, held between min and max. A change waits
for `scale_cooldown_s` after the previous one. Up: new replicas placed like the first ones; down: the
newest replicas stop (a request still running on one is cut). Each change is written as an
`endpoint.scaled` event, with the figures that made it, on the node of each replica it started or stopped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from cleverthis.tenancy.quotas import locked_quota
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.services.common import system_actor
from fleet.workloads.services.endpoint_events import endpoint_event_record
from fleet.workloads.services.endpoint_replicas import endpoint_summarise, replica_queue_start, replica_queue_stop
from fleet.workloads.services.endpoints import PlacementError, pick_replica_node, workspace_of_endpoint
from kernel.exceptions import QuotaExceeded

_SERVING = (EndpointStatus.PENDING, EndpointStatus.STARTING, EndpointStatus.RUNNING)


@dataclass(frozen=True)
class ScaleDecision:
    """What one pass decided for an endpoint, and why."""

    endpoint_id: object
    replicas: int  # serving (or on their way) before the pass
    wanted: int  # what the load asks for, within min..max
    rate_per_min: float
    changed: int  # replicas started (+) or stopped (-); 0 when held (cool-down, no node fits) or already right
    reason: str


def desired_replicas(*, rate_per_min: float, target: int, minimum: int, maximum: int) -> int:
    """Replicas for `rate_per_min` requests at `target` per replica, held within minimum..maximum."""
    return max(minimum, min(maximum, math.ceil(rate_per_min / target) if target > 0 else minimum))


def endpoint_autoscale(*, endpoint_id: object, now: datetime | None = None) -> ScaleDecision | None:
    """One autoscaling pass for the endpoint (see the module); None when it is not autoscaled or running, or
    on its first pass (which only takes the first sample)."""
    now = now or timezone.now()
    with transaction.atomic():
        workspace_id = workspace_of_endpoint(endpoint_id)
        if workspace_id is None:
            return None
        locked_quota(workspace_id)  # first: the lock order of admissions (tenancy.quotas)
        endpoint = (
            Endpoint.objects.select_for_update(of=("self",))
            .select_related("cluster__workspace")
            .filter(pk=endpoint_id)
            .first()
        )
        if endpoint is None or endpoint.target_requests_per_min <= 0 or endpoint.status != EndpointStatus.RUNNING:
            return None
        sampled_at, sampled = endpoint.load_sample_at, endpoint.load_sample_count
        endpoint.load_sample_at, endpoint.load_sample_count = now, endpoint.request_count
        endpoint.save(update_fields=["load_sample_at", "load_sample_count"])
        if sampled_at is None or now <= sampled_at:
            return None
        rate = max(endpoint.request_count - sampled, 0) * 60.0 / (now - sampled_at).total_seconds()
        serving = list(
            EndpointReplica.objects.select_for_update(of=("self",))
            .select_related("node")
            .filter(endpoint=endpoint, replacements__isnull=True, status__in=_SERVING)
            .order_by("created_at", "server_id")
        )
        wanted = desired_replicas(
            rate_per_min=rate,
            target=endpoint.target_requests_per_min,
            minimum=endpoint.min_replicas,
            maximum=endpoint.max_replicas,
        )
        figures = (
            f"{rate:.0f} requests/min over {len(serving)} replica(s), target "
            f"{endpoint.target_requests_per_min}/min each"
        )
        decision = ScaleDecision(endpoint.pk, len(serving), wanted, rate, 0, f"{figures}: {wanted} wanted")
        if wanted == len(serving):
            return decision
        if endpoint.scaled_at is not None and (now - endpoint.scaled_at).total_seconds() < endpoint.scale_cooldown_s:
            return ScaleDecision(endpoint.pk, len(serving), wanted, rate, 0, f"{figures}: held by the cool-down")
        actor = system_actor(endpoint.cluster.workspace)
        changed = 0
        why = f"Endpoint {endpoint.hostname} scaled {len(serving)} → {wanted}: {figures}"
        if wanted > len(serving):
            used = {r.node_id for r in serving}
            for _ in range(wanted - len(serving)):
                try:
                    target = pick_replica_node(endpoint, avoid=used)
                except PlacementError as exc:
                    why += f"; no node for more ({exc})"
                    break
                used.add(target.pk)
                try:
                    with transaction.atomic():  # a savepoint: a replica the quotas refuse leaves nothing
                        replica = EndpointReplica.objects.create(endpoint=endpoint, node=target)
                        command = replica_queue_start(actor=actor, endpoint=endpoint, replica=replica, node=target)
                except QuotaExceeded as exc:
                    why += f"; stopped at the workspace's quota ({exc})"
                    break
                endpoint_event_record(
                    endpoint=endpoint, node_id=target.pk, kind="endpoint.scaled", message=why, command=command
                )
                changed += 1
        else:
            for replica in serving[wanted:][::-1]:
                replica_queue_stop(actor=actor, endpoint=endpoint, replica=replica)
                endpoint_event_record(endpoint=endpoint, node_id=replica.node_id, kind="endpoint.scaled", message=why)
                changed -= 1
        if changed:
            endpoint.scaled_at = now
            endpoint.save(update_fields=["scaled_at"])
            endpoint_summarise(endpoint)
        return ScaleDecision(endpoint.pk, len(serving), wanted, rate, changed, why)


def endpoints_to_autoscale() -> list[object]:
    """Ids of the running endpoints with autoscaling on (what the beat passes over)."""
    rows = Endpoint.objects.filter(status=EndpointStatus.RUNNING, target_requests_per_min__gt=0)
    return list(rows.order_by("pk").values_list("pk", flat=True))

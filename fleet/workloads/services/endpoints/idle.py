"""Scale to zero: an endpoint with `min_replicas` 0 sleeps after `idle_timeout_s` without requests, and the
next request wakes it (a cold start).

`endpoint_idle` is one pass over a running endpoint (the beat's `endpoints_idle_tick` runs it for each in
`endpoints_to_idle`): when its last request (`last_request_at`, else when its newest serving replica last
changed, i.e. came up) is older than `idle_timeout_s`, every replica leaves rotation now and is stopped once
drained (`replica_retire`, then `endpoint_heal` after ENDPOINT_DRAIN_S), and the endpoint reads idle
("Scaled to zero"; `idle_since`). It then holds no GPU or VRAM, but keeps its place in the `endpoints`
quota (`fleet.workloads.quotas`).

`endpoint_wake` starts it again: idempotent under concurrency (the endpoint's row lock decides: only the
first caller finds it idle and queues a start; the others find it pending and do nothing). A replica still
draining is put back in rotation (no start needed); else one stopped replica starts again (placed like any
replica, admitted against the GPU/VRAM quotas like any start: `QuotaExceeded` / `PlacementError` leave it
idle). The proxy calls it for the first request to an idle endpoint (`fleet.proxy.endpoint_routes`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.services.common import system_actor
from fleet.workloads.services.endpoints.events import endpoint_event_record
from fleet.workloads.services.endpoints.locking import lock_endpoint
from fleet.workloads.services.endpoints.placement import pick_replica_node
from fleet.workloads.services.endpoints.replicas import endpoint_summarise, replica_queue_start, replica_retire

_SERVING = (EndpointStatus.PENDING, EndpointStatus.STARTING, EndpointStatus.RUNNING)


def endpoints_to_idle() -> list[object]:
    """Ids of the running endpoints that may scale to zero (what the beat passes over)."""
    rows = Endpoint.objects.filter(status=EndpointStatus.RUNNING, min_replicas=0, idle_since__isnull=True)
    return list(rows.order_by("pk").values_list("pk", flat=True))


def _last_activity(endpoint: Endpoint, serving: list[EndpointReplica]) -> datetime | None:
    """When the endpoint was last used: its last request, or when a serving replica last changed (came up),
    whichever is later."""
    times = [t for t in (endpoint.last_request_at, *(r.updated_at for r in serving)) if t is not None]
    return max(times) if times else None


def endpoint_idle(*, endpoint_id: object, now: datetime | None = None) -> bool:
    """One idle pass for the endpoint (see the module); True when it scaled to zero now."""
    now = now or timezone.now()
    with transaction.atomic():
        endpoint = (
            Endpoint.objects.select_for_update(of=("self",))
            .select_related("cluster__workspace")
            .filter(pk=endpoint_id)
            .first()
        )
        if (
            endpoint is None
            or endpoint.min_replicas != 0
            or endpoint.idle_timeout_s <= 0
            or endpoint.status != EndpointStatus.RUNNING
            or endpoint.idle_since is not None
        ):
            return False
        serving = list(
            EndpointReplica.objects.select_for_update(of=("self",))
            .select_related("node")
            .filter(endpoint=endpoint, replacements__isnull=True, retired_at__isnull=True, status__in=_SERVING)
            .order_by("created_at", "server_id")
        )
        last = _last_activity(endpoint, serving)
        if last is not None and now - last < timedelta(seconds=endpoint.idle_timeout_s):
            return False
        actor = system_actor(endpoint.cluster.workspace)
        for replica in serving:
            replica_retire(actor=actor, endpoint=endpoint, replica=replica)
        quiet = int((now - last).total_seconds()) if last is not None else endpoint.idle_timeout_s
        endpoint.idle_since = now
        endpoint.save(update_fields=["idle_since", "updated_at"])
        endpoint_event_record(
            endpoint=endpoint,
            kind="endpoint.scaled_to_zero",
            message=f"Endpoint {endpoint.hostname} scaled to zero after {quiet} s without requests "
            f"(idle timeout {endpoint.idle_timeout_s} s): {len(serving)} replica(s) leave rotation",
            data={"idle_s": quiet, "replicas": [r.server_id for r in serving]},
        )
        endpoint_summarise(endpoint)
    return True


def endpoint_wake(*, endpoint_id: object, reason: str = "woken by a request") -> EndpointReplica | None:
    """Start an idle endpoint again (see the module); returns the replica brought back or started, None when
    it was not idle (already woken, starting, running, stopped or gone). Raises `QuotaExceeded` or
    `PlacementError` (nothing written, the endpoint stays idle) when no replica may start."""
    with transaction.atomic():
        endpoint = lock_endpoint(endpoint_id)
        if endpoint is None or endpoint.status != EndpointStatus.IDLE:
            return None
        replicas = list(
            EndpointReplica.objects.select_for_update(of=("self",))
            .select_related("node")
            .filter(endpoint=endpoint, replacements__isnull=True)
            .order_by("created_at", "server_id")
        )
        draining = next((r for r in replicas if r.status == EndpointStatus.RUNNING and r.retired_at), None)
        command = None
        if draining is not None:  # still serving its last requests: back in rotation, nothing to start
            draining.retired_at = None
            draining.save(update_fields=["retired_at", "updated_at"])
            replica, node_id, how = draining, draining.node_id, f"replica {draining.server_id} back in rotation"
        else:
            target = pick_replica_node(endpoint)
            replica = next((r for r in replicas if r.status in (EndpointStatus.STOPPED, EndpointStatus.FAILED)), None)
            if replica is None:
                replica = EndpointReplica.objects.create(endpoint=endpoint, node=target)
            actor = system_actor(endpoint.cluster.workspace)
            command = replica_queue_start(actor=actor, endpoint=endpoint, replica=replica, node=target)
            node_id, how = target.pk, f"replica {replica.server_id} starting on {target.name}"
        Endpoint.objects.filter(pk=endpoint.pk).update(idle_since=None)
        endpoint.idle_since = None
        endpoint_event_record(
            endpoint=endpoint,
            node_id=node_id,
            kind="endpoint.cold_start",
            message=f"Endpoint {endpoint.hostname} cold start: {reason}; {how}",
            command=command,
        )
        endpoint_summarise(endpoint)
    return replica

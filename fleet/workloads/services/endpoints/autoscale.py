"""The endpoints' autoscaler: between `min_replicas` and `max_replicas` on their load.

One pass per running endpoint with a target (the beat's `endpoints_autoscale_tick`). Three metrics, each
with a target per replica (0 = off):

- requests per minute (`target_requests_per_min`): measured from the requests the proxies wrote to the
  endpoint's `request_count` since the previous pass (written at most every `ENDPOINT_REQUESTS_FLUSH_S` per
  web process, so a burst shows a few seconds late; the first pass only takes the first sample);
- requests in flight (`target_in_flight`) and completion tokens per second (`target_tokens_per_s`): the
  endpoint's replicas' figures summed over every live web process (`fleet.replica_load`, published about
  every second, so they are at most a few seconds old and a dead process's count is gone within its TTL).

- requests waiting in the endpoint's queue (`target_queued`, `fleet.admission`, summed over the web processes
  like the in-flight figures): it asks for the replicas the requests in flight need at the endpoint's
  concurrency limit, plus one per `target_queued` requests waiting: `ceil(in_flight / limit) +
  ceil(queued / target)`, so a queue that builds adds replicas and an empty one lets the others decide.

Each other enabled metric asks for `ceil(total / target)` replicas; the largest ask wins, held between min and
max (and at least 1: an endpoint goes to zero only through the idle pass, `endpoint_idle`). A change waits
for `scale_cooldown_s` after the previous one. Up: new replicas placed like the first ones; down: the newest
replicas are retired (`replica_retire`: out of rotation at once, stopped ENDPOINT_DRAIN_S later by the
healing pass, so the requests they still serve finish). Each change is written as an
`endpoint.scaled` event in the endpoint's log whose message gives every metric's figures, the deciding one
first (e.g. "scaled 1 → 4: 31 requests in flight over 1 replica(s), target 8 each"), and on the node of each
replica it started or retired.

The beat runs every 15 s: the rate is measured over that interval, and a shorter one would alias with the
proxies' 5 s writes of `request_count`; the in-flight and tokens figures are fresh at each pass, so a burst
is answered within one interval, short beside a replica's start (a model load) and the default cool-down.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from fleet.replica_load import QueueLoad, ReplicaLoad
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.selectors import queue_loads, replica_loads
from fleet.workloads.services.common import system_actor
from fleet.workloads.services.endpoints.events import endpoint_event_record
from fleet.workloads.services.endpoints.locking import lock_endpoint
from fleet.workloads.services.endpoints.placement import PlacementError, pick_replica_node
from fleet.workloads.services.endpoints.replicas import endpoint_summarise, replica_queue_start, replica_retire
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
    in_flight: int = 0  # requests in flight over the endpoint's replicas, all web processes
    tokens_per_s: float = 0.0  # completion tokens per second over them
    queued: int = 0  # requests waiting in the endpoint's queue, all web processes


@dataclass(frozen=True)
class LoadMetric:
    """One metric an endpoint scales on: its total over the replicas, the target per replica, the ask."""

    total: float
    target: int
    asks: int  # ceil(total / target), before min..max
    text: str  # the figures in words


def desired_replicas(*, rate_per_min: float, target: int, minimum: int, maximum: int) -> int:
    """Replicas for `rate_per_min` requests at `target` per replica, held within minimum..maximum."""
    return max(minimum, min(maximum, math.ceil(rate_per_min / target) if target > 0 else minimum))


def _metrics(
    endpoint: Endpoint, *, replicas: int, rate: float, in_flight: int, tokens: float, queued: int = 0
) -> list[LoadMetric]:
    """The enabled metrics of `endpoint` with their figures, the largest ask first (ties: in the order below)."""
    found = []
    if endpoint.target_queued > 0:
        limit = endpoint.concurrency_limit
        asks = math.ceil(in_flight / limit) + math.ceil(queued / endpoint.target_queued)
        text = (
            f"{queued} requests queued (and {in_flight} in flight at {limit} each) over {replicas} replica(s), "
            f"target {endpoint.target_queued} queued each"
        )
        found.append(LoadMetric(queued, endpoint.target_queued, asks, text))
    for total, target, words, unit in (
        (in_flight, endpoint.target_in_flight, f"{in_flight} requests in flight", ""),
        (tokens, endpoint.target_tokens_per_s, f"{tokens:.0f} tokens/s", "/s"),
        (rate, endpoint.target_requests_per_min, f"{rate:.0f} requests/min", "/min"),
    ):
        if target > 0:
            text = f"{words} over {replicas} replica(s), target {target}{unit} each"
            found.append(LoadMetric(total, target, math.ceil(total / target), text))
    return sorted(found, key=lambda m: -m.asks)


def endpoint_autoscale(
    *,
    endpoint_id: object,
    now: datetime | None = None,
    loads: Mapping[str, ReplicaLoad] | None = None,
    queues: Mapping[str, QueueLoad] | None = None,
) -> ScaleDecision | None:
    """One autoscaling pass for the endpoint (see the module); None when it is not autoscaled or running, or
    on its first pass with a requests/min target (which only takes the first sample). `loads` and `queues`:
    the replicas' and the queues' shared figures (`selectors.replica_loads`, `selectors.queue_loads`, read
    here when needed and not given)."""
    now = now or timezone.now()
    with transaction.atomic():
        endpoint = lock_endpoint(endpoint_id)
        if endpoint is None or not _autoscaled(endpoint) or endpoint.status != EndpointStatus.RUNNING:
            return None
        sampled_at, sampled = endpoint.load_sample_at, endpoint.load_sample_count
        endpoint.load_sample_at, endpoint.load_sample_count = now, endpoint.request_count
        endpoint.save(update_fields=["load_sample_at", "load_sample_count"])
        first_sample = sampled_at is None or now <= sampled_at
        if first_sample and endpoint.target_requests_per_min > 0:
            return None
        rate = 0.0
        if not first_sample:
            rate = max(endpoint.request_count - sampled, 0) * 60.0 / (now - sampled_at).total_seconds()
        serving = list(
            EndpointReplica.objects.select_for_update(of=("self",))
            .select_related("node")
            .filter(endpoint=endpoint, replacements__isnull=True, retired_at__isnull=True, status__in=_SERVING)
            .order_by("created_at", "server_id")
        )
        in_flight, tokens, queued = 0, 0.0, 0
        if endpoint.target_queued > 0:
            queues = queue_loads() if queues is None else queues
            queued = queues.get(str(endpoint.pk), QueueLoad()).waiting
        if endpoint.target_in_flight > 0 or endpoint.target_tokens_per_s > 0 or endpoint.target_queued > 0:
            loads = replica_loads() if loads is None else loads
            # every replica still serving counts (a retired one may finish its requests), not only the current
            keys = EndpointReplica.objects.filter(endpoint=endpoint, status__in=EndpointStatus.live())
            for key in keys.values_list("server_id", flat=True):
                load = loads.get(key)
                if load is not None:
                    in_flight += load.in_flight
                    tokens += load.tokens_per_s
        metrics = _metrics(
            endpoint, replicas=len(serving), rate=rate, in_flight=in_flight, tokens=tokens, queued=queued
        )
        # to zero only by the idle pass (`endpoint_idle`), never on load
        wanted = max(endpoint.min_replicas, 1, min(endpoint.max_replicas, metrics[0].asks))
        figures = "; ".join(m.text for m in metrics)
        held = {"endpoint_id": endpoint.pk, "replicas": len(serving), "wanted": wanted, "rate_per_min": rate}
        held |= {"in_flight": in_flight, "tokens_per_s": tokens, "queued": queued, "changed": 0}
        decision = ScaleDecision(**held, reason=f"{figures}: {wanted} wanted")
        if wanted == len(serving):
            return decision
        if endpoint.scaled_at is not None and (now - endpoint.scaled_at).total_seconds() < endpoint.scale_cooldown_s:
            return ScaleDecision(**held, reason=f"{figures}: held by the cool-down")
        actor = system_actor(endpoint.cluster.workspace)
        changed = 0
        why = f"Endpoint {endpoint.hostname} scaled {len(serving)} → {wanted}: {figures}"
        data = {"from": len(serving), "to": wanted, "rate_per_min": round(rate, 1), "in_flight": in_flight}
        data["tokens_per_s"] = round(tokens, 1)
        data["queued"] = queued
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
                    endpoint=endpoint,
                    node_id=target.pk,
                    kind="endpoint.scaled",
                    message=why,
                    data=data,
                    command=command,
                )
                changed += 1
        else:
            for replica in serving[wanted:][::-1]:
                replica_retire(actor=actor, endpoint=endpoint, replica=replica)
                endpoint_event_record(
                    endpoint=endpoint, node_id=replica.node_id, kind="endpoint.scaled", message=why, data=data
                )
                changed -= 1
        if changed:
            endpoint.scaled_at = now
            endpoint.save(update_fields=["scaled_at"])
            endpoint_summarise(endpoint)
        return ScaleDecision(**{**held, "changed": changed}, reason=why)


def _autoscaled(endpoint: Endpoint) -> bool:
    targets = (endpoint.target_requests_per_min, endpoint.target_in_flight, endpoint.target_tokens_per_s)
    return any(t > 0 for t in (*targets, endpoint.target_queued))


def endpoints_to_autoscale() -> list[object]:
    """Ids of the running endpoints with autoscaling on (what the beat passes over)."""
    targets = Q(target_requests_per_min__gt=0) | Q(target_in_flight__gt=0) | Q(target_tokens_per_s__gt=0)
    targets |= Q(target_queued__gt=0)
    rows = Endpoint.objects.filter(targets, status=EndpointStatus.RUNNING)
    return list(rows.order_by("pk").values_list("pk", flat=True))

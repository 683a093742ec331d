"""Reads of workloads, scoped to the user's workspaces: endpoints, their event logs, their replicas' load."""

from __future__ import annotations

import logging
from typing import Any

import redis
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db.models import Exists, Prefetch, Q, QuerySet

from fleet import replica_load
from fleet.replica_load import QueueLoad, ReplicaLoad
from fleet.workloads.models import ApiKeyEndpoint, Endpoint, EndpointEvent, EndpointReplica, EndpointStatus
from tenancy.selectors import workspace_ids

log = logging.getLogger(__name__)


def key_endpoint_limit(*, user: AbstractBaseUser | AnonymousUser, field: str = "pk") -> Q:
    """The condition on `field` (an endpoint id) that keeps what the caller's API key may reach: a key
    limited to chosen endpoints (`ApiKeyEndpoint` rows) reaches those alone, on the management API as on
    the endpoints' origins; without a key, or with an unlimited one, everything (one query, no extra).
    """
    grant = getattr(user, "api_key_grant", None)
    if grant is None:
        return Q()
    chosen = ApiKeyEndpoint.objects.filter(key_id=grant.key_id)
    return ~Q(Exists(chosen)) | Q(**{f"{field}__in": chosen.filter(endpoint__isnull=False).values("endpoint_id")})


def key_is_endpoint_limited(*, user: AbstractBaseUser | AnonymousUser) -> bool:
    """Whether the caller's API key is limited to chosen endpoints (it then may not create others)."""
    grant = getattr(user, "api_key_grant", None)
    return grant is not None and ApiKeyEndpoint.objects.filter(key_id=grant.key_id).exists()


def endpoint_list(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[Endpoint]:
    """Endpoints in the user's workspaces, with their current replicas (and retired ones still live) in
    order, with their nodes."""
    replicas = (
        EndpointReplica.objects.filter(Q(replacements__isnull=True) | Q(status__in=EndpointStatus.live()))
        .distinct()
        .select_related("node")
        .order_by("created_at", "server_id")
    )
    return (
        Endpoint.objects.filter(key_endpoint_limit(user=user), cluster__workspace__in=workspace_ids(user=user))
        .select_related("node", "cluster")
        .prefetch_related(Prefetch("replicas", replicas))
    )


def endpoint_event_list(*, endpoint: Endpoint) -> QuerySet[EndpointEvent]:
    """The endpoint's event log, newest first, with each event's node."""
    return EndpointEvent.objects.filter(endpoint=endpoint).select_related("node").order_by("-created_at", "-pk")


def endpoint_update_failure(*, endpoint: Endpoint) -> EndpointEvent | None:
    """The event saying why the endpoint's last rolling update failed and what to do, while no update came
    after it (`endpoint_update_failed`); None otherwise."""
    last = (
        EndpointEvent.objects.filter(endpoint=endpoint, kind__in=["endpoint.updating", "endpoint.update_failed"])
        .order_by("-created_at", "-pk")
        .first()
    )
    return last if last is not None and last.kind == "endpoint.update_failed" else None


START_PHASES_SHOWN = 5
PHASE_LABELS = (
    ("placed", "Placed"),
    ("weights", "Weights"),
    ("server_started", "Server started"),
    ("model_loaded", "Model loaded"),
    ("healthy", "First health check"),
    ("adapters", "Adapters loaded"),
    ("total", "Total"),
)


def endpoint_start_phases(*, endpoint: Endpoint) -> list[dict[str, Any]]:
    """The newest START_PHASES_SHOWN replica starts of the endpoint, each: when, replica, warm or cold, weight bytes
    and its phases' seconds in order (`services.endpoints.cold_starts`)."""
    events = EndpointEvent.objects.filter(endpoint=endpoint, kind="endpoint.start_phases").order_by("-created_at")
    starts = []
    for event in events[:START_PHASES_SHOWN]:
        phases = event.data.get("phases") or {}
        starts.append(
            {
                "at": event.created_at,
                "replica": event.data.get("replica", ""),
                "cold": event.data.get("weights") == "downloaded",
                "weights_mb": (event.data.get("weights_bytes") or 0) / (1024 * 1024),
                "phases": [(label, phases.get(key)) for key, label in PHASE_LABELS],
            }
        )
    return starts


def replica_loads() -> dict[str, ReplicaLoad]:
    """Every replica's requests in flight and tokens/s over all live web processes, by server id
    (`fleet.replica_load`); raises redis.RedisError when Redis cannot be read."""
    return replica_load.read()


def queue_loads() -> dict[str, QueueLoad]:
    """Every endpoint's wait queue (by endpoint id) over the web processes (raises redis.RedisError)."""
    return replica_load.read_queues()


def queue_loads_shown() -> dict[str, QueueLoad] | None:
    """Every endpoint's wait queue (by endpoint id) over the web processes; None when Redis cannot be read."""
    try:
        return replica_load.read_queues()
    except redis.RedisError:
        log.warning("queue figures unreadable", exc_info=True)
        return None


def replica_loads_shown() -> dict[str, ReplicaLoad] | None:
    """`replica_loads` for pages and the API: None (figures unknown) when Redis cannot be read."""
    try:
        return replica_load.read()
    except redis.RedisError:
        log.warning("replica load unreadable", exc_info=True)
        return None

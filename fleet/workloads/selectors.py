"""Reads of workloads, scoped to the user's workspaces: endpoints, their event logs, their replicas' load."""

from __future__ import annotations

import logging

import redis
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db.models import Prefetch, Q, QuerySet

from fleet import replica_load
from fleet.replica_load import ReplicaLoad
from fleet.workloads.models import Endpoint, EndpointEvent, EndpointReplica, EndpointStatus
from tenancy.selectors import workspace_ids

log = logging.getLogger(__name__)


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
        Endpoint.objects.filter(cluster__workspace__in=workspace_ids(user=user))
        .select_related("node", "cluster")
        .prefetch_related(Prefetch("replicas", replicas))
    )


def endpoint_event_list(*, endpoint: Endpoint) -> QuerySet[EndpointEvent]:
    """The endpoint's event log, newest first, with each event's node."""
    return EndpointEvent.objects.filter(endpoint=endpoint).select_related("node").order_by("-created_at", "-pk")


def replica_loads() -> dict[str, ReplicaLoad]:
    """Every replica's requests in flight and tokens/s over all live web processes, by server id
    (`fleet.replica_load`); raises redis.RedisError when Redis cannot be read."""
    return replica_load.read()


def replica_loads_shown() -> dict[str, ReplicaLoad] | None:
    """`replica_loads` for pages and the API: None (figures unknown) when Redis cannot be read."""
    try:
        return replica_load.read()
    except redis.RedisError:
        log.warning("replica load unreadable", exc_info=True)
        return None

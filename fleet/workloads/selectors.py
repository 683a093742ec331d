"""Reads of workloads, scoped to the user's workspaces: endpoints."""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db.models import Prefetch, Q, QuerySet

from cleverthis.tenancy.selectors import workspace_ids
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus


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

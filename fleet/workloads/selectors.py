"""Reads of workloads, scoped to the user's workspaces: containers, cached models, endpoints."""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db.models import QuerySet

from cleverthis.tenancy.selectors import workspace_ids
from fleet.workloads.models import Container, Endpoint, NodeModel


def container_list(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[Container]:
    """Containers in the user's workspaces."""
    return Container.objects.filter(cluster__workspace__in=workspace_ids(user=user)).select_related("node", "cluster")


def model_locations(*, user: AbstractBaseUser | AnonymousUser, model_id: str | None = None) -> QuerySet[NodeModel]:
    """Which models are cached on which node, in the user's workspaces (optionally one model id)."""
    rows = NodeModel.objects.filter(node__cluster__workspace__in=workspace_ids(user=user)).select_related(
        "node", "node__cluster"
    )
    if model_id:
        rows = rows.filter(model_id=model_id)
    return rows.order_by("model_id", "revision", "node__name", "node_id")


def endpoint_list(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[Endpoint]:
    """Endpoints in the user's workspaces."""
    return Endpoint.objects.filter(cluster__workspace__in=workspace_ids(user=user)).select_related("node", "cluster")

"""Reads for managed Ray, scoped to the requesting user's workspaces."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db.models import QuerySet

from raymgr.models import RayCluster, RayClusterEvent, RayNode, RayNodeStatus
from tenancy.selectors import scope_to_user

AnyUser = AbstractBaseUser | AnonymousUser


def ray_cluster_base() -> QuerySet[RayCluster]:
    """Unscoped Ray clusters with what list views show (constant query count)."""
    return RayCluster.objects.select_related("compute_cluster", "head_node").order_by("name", "pk")


def ray_cluster_list(*, user: AnyUser, workspace_id: Any = None) -> QuerySet[RayCluster]:
    """Ray clusters of `user`'s workspaces (optionally of one workspace)."""
    rows = scope_to_user(ray_cluster_base(), user=user)
    if workspace_id is not None:
        rows = rows.filter(workspace_id=workspace_id)
    return rows


def ray_node_list(*, cluster: RayCluster, include_stopped: bool = False) -> QuerySet[RayNode]:
    """The cluster's Ray nodes, head first; stopped ones only when asked."""
    rows = cluster.ray_nodes.select_related("node").order_by("role", "created_at")
    if not include_stopped:
        rows = rows.exclude(status=RayNodeStatus.STOPPED)
    return rows


def ray_event_list(*, cluster: RayCluster) -> QuerySet[RayClusterEvent]:
    """The cluster's event log, newest first."""
    return cluster.events.order_by("-created_at", "-pk")

"""Reads for the compute fleet, scoped to the requesting user's workspaces.

The `*_base()` functions define each queryset's joins once (used by the API mixin, which scopes them
itself); the `*_list` functions scope them to a user for pages and services.
"""

from __future__ import annotations

from django.db.models import Count, QuerySet

from fleet.models import Command, ComputeCluster, Namespace, Node, NodeEvent
from tenancy.selectors import AnyUser, scope_to_user


def cluster_base() -> QuerySet[ComputeCluster]:
    return ComputeCluster.objects.select_related("workspace").annotate(node_count=Count("nodes")).order_by("name")


def node_base() -> QuerySet[Node]:
    return Node.objects.select_related("cluster", "cluster__workspace").order_by("name", "created_at")


def command_base() -> QuerySet[Command]:
    return Command.objects.select_related("node", "cluster", "created_by").order_by("-created_at")


def namespace_base() -> QuerySet[Namespace]:
    return Namespace.objects.select_related("workspace", "cluster").order_by("name")


def cluster_list(*, user: AnyUser) -> QuerySet[ComputeCluster]:
    """Clusters of the user's workspaces, with `node_count`."""
    return scope_to_user(cluster_base(), user=user)


def node_list(*, user: AnyUser, cluster: ComputeCluster | None = None) -> QuerySet[Node]:
    """Nodes the user may see (optionally of one cluster); constant query count (joins, no N+1)."""
    nodes = scope_to_user(node_base(), user=user, workspace_field="cluster__workspace")
    return nodes.filter(cluster=cluster) if cluster is not None else nodes


def command_list(
    *, user: AnyUser, node: Node | None = None, cluster: ComputeCluster | None = None
) -> QuerySet[Command]:
    """Commands the user may see, newest first."""
    commands = scope_to_user(command_base(), user=user, workspace_field="cluster__workspace")
    if node is not None:
        commands = commands.filter(node=node)
    if cluster is not None:
        commands = commands.filter(cluster=cluster)
    return commands


def node_event_list(*, node: Node) -> QuerySet[NodeEvent]:
    """The node's event log, newest first (the caller has already checked access to `node`)."""
    return NodeEvent.objects.filter(node=node).select_related("command").order_by("-created_at")


def namespace_list(*, user: AnyUser) -> QuerySet[Namespace]:
    """Namespaces of the user's workspaces."""
    return scope_to_user(namespace_base(), user=user)

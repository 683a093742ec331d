"""The fleet's filtersets (nodes, commands, clusters, namespaces), shared by the API and the pages."""

from __future__ import annotations

from django.db.models import Q

from fleet.models import CommandStatus, CommandType, NodeStatus
from kernel.filters import Filter, FilterSet, as_uuid, boolean, choice, text


def sent_by(value: str) -> Q:
    """`by=<username>`: that user's commands; `by=system`: the control plane's own."""
    return Q(system=True) if value == "system" else Q(system=False, created_by__username=value)


NODE_FILTERS = FilterSet(
    cluster=Filter("cluster_id", as_uuid),
    status=Filter("status", choice(NodeStatus.values)),
    q=Filter("name__icontains", text()),
)
COMMAND_FILTERS = FilterSet(
    cluster=Filter("cluster_id", as_uuid),
    node=Filter("node_id", as_uuid),
    batch=Filter("batch_id", as_uuid),
    status=Filter("status", choice(CommandStatus.values)),
    command_type=Filter("command_type", choice(CommandType.values)),
    system=Filter("system", boolean),
    by=Filter(sent_by, text(150)),
)
CLUSTER_FILTERS = FilterSet(workspace=Filter("workspace_id", as_uuid), q=Filter("name__icontains", text()))
NAMESPACE_FILTERS = FilterSet(workspace=Filter("workspace_id", as_uuid), cluster=Filter("cluster_id", as_uuid))

"""Namespaces of a workspace, optionally bound to one of its clusters; Owner/Admin only."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError

from audit.services import created, new, on, operator_action
from fleet.models import ComputeCluster, Namespace
from fleet.services.common import full_clean
from kernel.rows import save_unique_name
from tenancy.mixins import require_operator
from tenancy.models import Workspace


def _parse_uuid(value: Any, field: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except (ValueError, TypeError):
        raise ValidationError({field: "Must be a UUID."}) from None


def _namespace_cluster(workspace: Workspace, cluster_id: Any) -> ComputeCluster | None:
    if cluster_id in (None, ""):
        return None
    pk = _parse_uuid(cluster_id, "cluster")
    cluster = ComputeCluster.objects.filter(pk=pk, workspace=workspace).first()
    if cluster is None:
        raise ValidationError({"cluster": "No such cluster in this workspace."})
    return cluster


@operator_action(
    "namespace.create",
    target=new("namespace"),
    result=created("namespace"),
    detail=lambda kw, _: {"cluster": str(kw["cluster_id"]) if kw.get("cluster_id") else None},
)
def namespace_create(*, actor: AbstractBaseUser, workspace: Workspace, name: str, cluster_id: Any = None) -> Namespace:
    """Create a namespace in `workspace`, optionally bound to one of its clusters."""
    require_operator(actor, workspace)
    namespace = Namespace(workspace=workspace, name=name, cluster=_namespace_cluster(workspace, cluster_id))
    full_clean(namespace, exclude=["workspace", "cluster"])
    save_unique_name(namespace, message="A namespace with this name already exists in the workspace.")
    return namespace


@operator_action(
    "namespace.bind",
    target=on("namespace", "namespace"),
    detail=lambda kw, _: {"cluster": str(kw["cluster_id"]) if kw.get("cluster_id") else None},
)
def namespace_bind(*, actor: AbstractBaseUser, namespace: Namespace, cluster_id: Any) -> Namespace:
    """Bind a namespace to a cluster of its workspace (None unbinds)."""
    require_operator(actor, namespace.workspace)
    namespace.cluster = _namespace_cluster(namespace.workspace, cluster_id)
    namespace.save(update_fields=["cluster"])
    return namespace


@operator_action("namespace.delete", target=on("namespace", "namespace"))
def namespace_delete(*, actor: AbstractBaseUser, namespace: Namespace) -> None:
    """Delete a namespace."""
    require_operator(actor, namespace.workspace)
    namespace.delete()

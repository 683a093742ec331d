"""Compute clusters: create, update (ArgoCD settings), delete with all their nodes; Owner/Admin only."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError

from audit.services import created, new, on, operator_action
from fleet.models import ComputeCluster, Mode
from fleet.services.common import full_clean
from fleet.services.nodes import node_purge
from kernel.rows import save_unique_name
from tenancy.mixins import require_operator
from tenancy.models import Workspace

ARGOCD_FIELDS = ("argocd_server", "argocd_token", "git_repo_url", "git_branch")
CLUSTER_FIELDS = ("name", "description", *ARGOCD_FIELDS)
NAME_TAKEN = "A cluster with this name already exists in the workspace."


def _clean_cluster_fields(fields: dict[str, Any]) -> dict[str, Any]:
    unknown = set(fields) - set(CLUSTER_FIELDS) - {"mode"}
    if unknown:
        raise ValidationError({name: "Unknown field." for name in sorted(unknown)})
    for name, value in fields.items():
        if not isinstance(value, str):
            raise ValidationError({name: "Must be a string."})
    return fields


@operator_action(
    "cluster.create",
    target=new("cluster"),
    result=created("cluster"),
    detail=lambda kw, _: {"mode": kw.get("mode", Mode.STANDALONE)},
)
def cluster_create(
    *,
    actor: AbstractBaseUser,
    workspace: Workspace,
    name: str,
    mode: str = Mode.STANDALONE,
    description: str = "",
    **argocd: str,
) -> ComputeCluster:
    """Create a compute cluster; Owner/Admin only; the mode is fixed from now on."""
    require_operator(actor, workspace)
    _clean_cluster_fields({"name": name, "mode": mode, "description": description, **argocd})
    if mode not in Mode.values:
        raise ValidationError({"mode": f"Unknown mode {mode!r}; choose one of {', '.join(Mode.values)}."})
    cluster = ComputeCluster(workspace=workspace, name=name.strip(), description=description, mode=mode, **argocd)
    full_clean(cluster)
    if mode == Mode.ARGOCD:
        _require_argocd(cluster)
    save_unique_name(cluster, message=NAME_TAKEN)
    return cluster


def _require_argocd(cluster: ComputeCluster) -> None:
    missing = {f: "Required in argocd mode." for f in ("argocd_server", "git_repo_url") if not getattr(cluster, f)}
    if missing:
        raise ValidationError(missing)


@operator_action(
    "cluster.update",
    target=on("cluster", "cluster"),
    detail=lambda kw, _: {"fields": sorted(set(kw) - {"actor", "cluster"})},
)
def cluster_update(*, actor: AbstractBaseUser, cluster: ComputeCluster, **fields: Any) -> ComputeCluster:
    """Change a cluster's name, description or ArgoCD settings; changing the mode is refused."""
    require_operator(actor, cluster.workspace)
    _clean_cluster_fields(fields)
    if "mode" in fields and fields["mode"] != cluster.mode:
        raise ValidationError({"mode": "The orchestration mode cannot be changed after the cluster is created."})
    fields.pop("mode", None)
    cluster = ComputeCluster.objects.select_for_update().get(pk=cluster.pk)
    for name, value in fields.items():
        setattr(cluster, name, value.strip() if name == "name" else value)
    full_clean(cluster, exclude=["workspace"])
    if cluster.mode == Mode.ARGOCD:
        _require_argocd(cluster)
    save_unique_name(cluster, message=NAME_TAKEN)
    return cluster


@operator_action("cluster.delete", target=on("cluster", "cluster"))
def cluster_delete(*, actor: AbstractBaseUser, cluster: ComputeCluster) -> None:
    """Delete a cluster and all its nodes (each node's certificates are revoked first)."""
    require_operator(actor, cluster.workspace)
    for node in list(cluster.nodes.all()):
        node_purge(node=node)
    cluster.delete()

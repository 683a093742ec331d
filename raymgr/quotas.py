"""What managed Ray counts against a workspace's quotas (`tenancy.quotas`).

A Ray cluster counts against `ray_clusters` from its creation until it is being deleted. A Ray node counts
while it is live (`RayNodeStatus.live()`) with what it requested when admitted (`RayNode.req_*`):

- a head or worker on the fleet's machines (docker, process) asks for its whole node, as `ray start`
  does: the node's CPU cores and memory, the GPUs the payload gives Ray (docker: all the node's) and
  then the node's VRAM; a worker also counts one Ray worker;
- a KubeRay head stands for the worker group KubeRay's own autoscaler may grow to: `max_workers` workers
  of the cluster's worker shape (CPU, memory, GPUs), admitted up front since no admission of ours sees
  those pods start.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import Count, FloatField, QuerySet, Sum, Value

from fleet.models import Node
from raymgr.models import RayCluster, RayClusterStatus, RayNode, RayNodeRole, RayNodeStatus, RayRuntime
from tenancy import quotas

MB_PER_GIB = 1024
GIB = Value(1024.0, FloatField())
NODE_QUOTAS = frozenset({"cpu_cores", "memory_gib", "gpus", "vram_gib", "ray_workers"})


def ray_usage(workspace_ids: Sequence[Any], names: frozenset[str]) -> list[QuerySet]:
    """The usage provider: per workspace, its Ray clusters and what its live Ray nodes requested."""
    parts = []
    if "ray_clusters" in names:
        clusters = RayCluster.objects.filter(workspace_id__in=workspace_ids).exclude(status=RayClusterStatus.DELETING)
        parts.append(quotas.usage_rows(clusters, workspace_field="workspace_id", ray_clusters=Count("pk")))
    if names & NODE_QUOTAS:
        live = RayNode.objects.filter(ray_cluster__workspace_id__in=workspace_ids, status__in=RayNodeStatus.live())
        parts.append(
            quotas.usage_rows(
                live,
                workspace_field="ray_cluster__workspace_id",
                cpu_cores=Sum("req_cpus"),
                memory_gib=Sum("req_memory_mb") / GIB,
                gpus=Sum("req_gpus"),
                vram_gib=Sum("req_vram_mb") / GIB,
                ray_workers=Sum("req_workers"),
            )
        )
    return parts


def ray_node_request(cluster: RayCluster, node: Node, role: str, num_gpus: int) -> dict[str, Any]:
    """The `RayNode.req_*` fields of a new Ray node of `cluster` on `node` (see the module's rules)."""
    if cluster.runtime == RayRuntime.KUBERAY:
        n = cluster.max_workers if role == RayNodeRole.HEAD else 1
        return {
            "req_cpus": n * cluster.worker_cpus,
            "req_memory_mb": n * cluster.worker_memory_mb,
            "req_gpus": n * cluster.worker_gpus,
            "req_vram_mb": 0,
            "req_workers": n,
        }
    return {
        "req_cpus": float(node.cpu_count),
        "req_memory_mb": node.memory_total_mb,
        "req_gpus": num_gpus,
        "req_vram_mb": node.vram_total_mb if num_gpus else 0,
        "req_workers": 1 if role == RayNodeRole.WORKER else 0,
    }


def admit_ray_node(cluster: RayCluster, node: Node, role: str, num_gpus: int = 0) -> dict[str, Any]:
    """Admit one Ray node against the workspace's quotas (`QuotaExceeded` when it does not fit) and return
    the `req_*` fields its row must be created with."""
    fields = ray_node_request(cluster, node, role, num_gpus)
    ask = {
        "cpu_cores": fields["req_cpus"],
        "memory_gib": fields["req_memory_mb"] / MB_PER_GIB,
        "gpus": fields["req_gpus"],
        "vram_gib": fields["req_vram_mb"] / MB_PER_GIB,
        "ray_workers": fields["req_workers"],
    }
    quotas.admit(workspace_id=cluster.workspace_id, ask=ask)
    return fields


def admit_ray_cluster(workspace_id: Any) -> None:
    """Admit one more Ray cluster in the workspace (`QuotaExceeded` at its `ray_clusters` quota)."""
    quotas.admit(workspace_id=workspace_id, ask={"ray_clusters": 1})


def register() -> None:
    """Hand the provider to tenancy (called from `RaymgrConfig.ready()`)."""
    quotas.register_usage("raymgr", ray_usage)

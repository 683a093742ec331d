"""Ray on kubernetes/argocd compute clusters (the kuberay runtime): one KubeRay RayCluster applied through
an agent; KubeRay's own autoscaler runs its workers."""

from __future__ import annotations

from typing import Any

from agent import protocol
from fleet.models import Mode, Node
from kernel.exceptions import IllegalTransition
from raymgr.models import RayCluster, RayNode, RayNodeRole, RayNodeStatus, RayRuntime
from raymgr.quotas import admit_ray_node
from raymgr.services.common import KUBERAY_GCS_PORT, S, dispatch, record_event
from raymgr.services.transitions import ray_cluster_transition, ray_node_set_status


def launch_kuberay_head(cluster: RayCluster, actor: Any) -> None:
    """Apply (or resume) the cluster's RayCluster through one online agent of the compute cluster."""
    nodes = sorted(
        Node.objects.filter(cluster_id=cluster.compute_cluster_id, status="online").select_related("cluster"),
        key=lambda n: n.name,
    )
    if not nodes:
        message = "No nodes online in the compute cluster: no agent can apply the RayCluster."
        record_event(cluster, "placement_failed", message, code="no_nodes_online")
        ray_cluster_transition(cluster=cluster, to=S.FAILED, reason=message)
        return
    node = nodes[0]
    requested = admit_ray_node(cluster, node, RayNodeRole.HEAD)  # its worker group, up to max_workers
    head = RayNode.objects.create(ray_cluster=cluster, node=node, role=RayNodeRole.HEAD, **requested)
    payload = protocol.RayHeadStartPayload(
        cluster_id=str(cluster.pk),
        member_id=str(head.pk),
        ray_version=cluster.ray_version,
        image=cluster.image(),
        runtime=RayRuntime.KUBERAY,
        gcs_port=cluster.gcs_port or KUBERAY_GCS_PORT,
        dashboard_port=cluster.dashboard_port,
        name=cluster.kuberay_name,
        min_workers=cluster.min_workers,
        max_workers=cluster.max_workers,
        idle_timeout_s=cluster.idle_timeout_s,
        worker_cpus=cluster.worker_cpus,
        worker_memory_mb=cluster.worker_memory_mb,
        worker_gpus=cluster.worker_gpus,
        worker_image=cluster.image(gpu=cluster.worker_gpus > 0),
    )
    try:
        command = dispatch(actor, node, "ray.head.start", payload)
    except IllegalTransition as exc:
        ray_node_set_status(head, RayNodeStatus.FAILED, failure_reason=str(exc))
        ray_cluster_transition(cluster=cluster, to=S.FAILED, reason=f"{node.name} cannot apply the RayCluster: {exc}")
        return
    RayNode.objects.filter(pk=head.pk).update(start_command=command)
    RayCluster.objects.filter(pk=cluster.pk).update(head_node=node, head_gcs_port=cluster.gcs_port or KUBERAY_GCS_PORT)
    where = "commits it for ArgoCD" if cluster.compute_cluster.mode == Mode.ARGOCD else "applies it"
    record_event(
        cluster,
        "placement",
        f"RayCluster {cluster.kuberay_name}: {node.name} {where}",
        node_id=str(node.pk),
        command_id=str(command.pk),
    )

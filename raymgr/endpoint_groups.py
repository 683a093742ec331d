"""Managed Ray clusters as hosts of distributed endpoints: the source `fleet.workloads.groups` asks.

A group runs on every Ray node of a running cluster of the docker or process runtime (KubeRay's nodes are pods,
not fleet nodes): the head's fleet node is the leader (rank 0, serves the API) and each worker's a follower. The
leader's address is the one the cluster's workers join the head at (`RayCluster.head_ip`, reported by the head's
agent), so the followers' agents reach it the same way. Each member carries the GPUs and VRAM its Ray node was
admitted with (`raymgr.quotas`), which the rank on it is not charged again.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError

from fleet.workloads.groups import GroupMember, GroupPlan, MemberState, register_group_source
from fleet.workloads.models import EndpointReplica, EndpointStatus
from raymgr.models import RayCluster, RayClusterStatus, RayNode, RayNodeRole, RayNodeStatus, RayRuntime

# The agent names a Ray node's container `ray-<RayNode id>` (`agent.ray.members.member_name`).
CONTAINER_PREFIX = "ray-"


def _label(ray_node: RayNode) -> str:
    return "head" if ray_node.role == RayNodeRole.HEAD else f"worker {ray_node.pk.hex[:8]}"


def _refuse(message: str) -> ValidationError:
    return ValidationError({"ray_cluster": message})


class RayGroupSource:
    """Answers for the Ray clusters of raymgr (registered by `register`)."""

    def plan(self, *, ray_cluster_id: Any, workspace_id: Any) -> GroupPlan:
        cluster = RayCluster.objects.filter(pk=ray_cluster_id, workspace_id=workspace_id).first()
        if cluster is None:
            raise _refuse("No such Ray cluster in this workspace.")
        if cluster.status != RayClusterStatus.RUNNING:
            raise _refuse(f"Ray cluster {cluster.name} is {cluster.status}; a distributed endpoint needs it running.")
        if cluster.runtime == RayRuntime.KUBERAY:
            raise _refuse("A KubeRay cluster's Ray nodes are pods, not fleet nodes: choose a docker or process one.")
        nodes = list(
            cluster.ray_nodes.filter(status__in=RayNodeStatus.live())
            .select_related("node")
            .order_by("role", "created_at", "pk")  # "head" < "worker": the head first
        )
        waiting = [n for n in nodes if n.status != RayNodeStatus.RUNNING]
        if waiting:
            n = waiting[0]
            raise _refuse(f"Ray {_label(n)} of {cluster.name} is {n.status}; every Ray node must be running.")
        if not nodes or nodes[0].role != RayNodeRole.HEAD:
            raise _refuse(f"Ray cluster {cluster.name} has no running head.")
        address = cluster.head_ip or nodes[0].ip or nodes[0].node.hostname
        # ranks run inside the Ray containers where those carry vLLM: the cluster serves vLLM, or (the fallback
        # for installations whose RAY_IMAGE_TEMPLATE already names a vLLM image) ENDPOINT_GROUP_IN_RAY_CONTAINER
        inside = cluster.serves_vllm or settings.ENDPOINT_GROUP_IN_RAY_CONTAINER
        docker = cluster.runtime == RayRuntime.DOCKER and inside
        members = tuple(
            GroupMember(
                ray_node=str(n.pk),
                node=n.node,
                label=_label(n),
                container=f"{CONTAINER_PREFIX}{n.pk}" if docker else "",
                gpus=n.req_gpus,  # admitted for the Ray node (`raymgr.quotas`): the rank runs on them
                vram_mb=n.req_vram_mb,
            )
            for n in nodes
        )
        return GroupPlan(members=members, master_addr=address)

    def lost(self, *, ray_nodes: list[str]) -> str:
        rows = {str(n.pk): n for n in RayNode.objects.filter(pk__in=ray_nodes).select_related("node", "ray_cluster")}
        for ray_node in ray_nodes:
            row = rows.get(ray_node)
            if row is None:
                return f"Ray node {ray_node[:8]} is gone (its cluster was deleted or scaled down)"
            if row.status != RayNodeStatus.RUNNING:
                why = f": {row.failure_reason}" if row.failure_reason else ""
                return f"Ray {_label(row)} of {row.ray_cluster.name} on node {row.node.name} is {row.status}{why}"
        return ""

    def states(self, *, ray_nodes: list[str]) -> dict[str, MemberState]:
        return {
            str(n.pk): MemberState(label=_label(n), status=n.status)
            for n in RayNode.objects.filter(pk__in=[r for r in ray_nodes if r])
        }

    def held(self, *, ray_nodes: list[str]) -> set[str]:
        live = RayNode.objects.filter(pk__in=[r for r in ray_nodes if r], status__in=RayNodeStatus.live())
        return {str(pk) for pk in live.values_list("pk", flat=True)}


def ranks_on(ray_nodes: list[str]) -> set[str]:
    """The Ray nodes among `ray_nodes` a live rank of a distributed endpoint uses (the autoscaler keeps them)."""
    return set(
        EndpointReplica.objects.filter(ray_node__in=ray_nodes, status__in=EndpointStatus.live()).values_list(
            "ray_node", flat=True
        )
    )


def register() -> None:
    """Let distributed endpoints run on managed Ray clusters (at app start)."""
    register_group_source(RayGroupSource())

"""Starting a Ray cluster's head on its runtime, and stopping or draining its Ray nodes."""

from __future__ import annotations

import contextlib
from typing import Any

from django.db import transaction

from agent import protocol
from kernel.exceptions import IllegalTransition
from raymgr.models import RayCluster, RayNode, RayNodeStatus
from raymgr.services.common import S, dispatch, head_gcs_port, operator_for, record_event, stop_in_flight
from raymgr.services.hosts import launch_host_head
from raymgr.services.kuberay import launch_kuberay_head
from raymgr.services.transitions import ray_node_set_status


def launch_head(cluster: RayCluster, actor: Any) -> None:
    """Start the cluster's head: a KubeRay RayCluster, or a head process/container placed on a node."""
    if cluster.is_kuberay:
        launch_kuberay_head(cluster, actor)
        return
    launch_host_head(cluster, actor)


def stop_ray_node(cluster: RayCluster, ray_node: RayNode, actor: Any) -> None:
    """Send `ray.node.stop` for one Ray node (kuberay: delete the RayCluster when deleting, else suspend it).

    Never while a stop of that Ray node is in flight: a second stop would cut the first one short (the
    engine kills a container it is already stopping). The in-flight stop's result decides what follows.
    """
    if stop_in_flight(ray_node):
        return
    payload = protocol.RayNodeStopPayload(
        cluster_id=str(cluster.pk),
        member_id=str(ray_node.pk),
        runtime=cluster.runtime,
        container=ray_node.container_id,
        delete=cluster.is_kuberay and cluster.status == S.DELETING,  # otherwise the RayCluster is suspended
    )
    try:
        command = dispatch(actor, ray_node.node, "ray.node.stop", payload)
    except IllegalTransition as exc:
        ray_node_set_status(ray_node, RayNodeStatus.STOPPED, failure_reason=str(exc), pending_command=None)
        return
    ray_node_set_status(ray_node, RayNodeStatus.STOPPING, pending_command=command)


def remove_failed_ray_node(cluster: RayCluster, ray_node: RayNode) -> None:
    """Once the transaction commits, send `ray.node.stop` for a Ray node that just failed (its container killed
    or exited, its process gone), so that its agent removes what is left of it: an exited container stays on
    its node otherwise.

    The Ray node stays failed with its reason: the stop is not its pending command, so its outcome changes no
    state (`results._on_stop`). A node offline now gets it when it reconnects (a queued command waits). Sent
    after commit: queuing locks the Ray node's host, which the fleet's lock order takes before the Ray rows
    locked here. KubeRay clusters have no Ray node of their own to remove; without an Owner/Admin nothing is
    sent.
    """
    actor = operator_for(cluster)
    if cluster.is_kuberay or actor is None:
        return
    payload = protocol.RayNodeStopPayload(
        cluster_id=str(cluster.pk), member_id=str(ray_node.pk), runtime=cluster.runtime, container=ray_node.container_id
    )
    node = ray_node.node

    def send() -> None:
        with contextlib.suppress(IllegalTransition):  # the node was deleted: nothing of it is left to remove
            dispatch(actor, node, "ray.node.stop", payload)

    transaction.on_commit(send, robust=True)


def stop_all(cluster: RayCluster, actor: Any, *, why: str) -> None:
    """Stop every live Ray node of the cluster, with an event saying `why` (those already stopping are left to
    the stop in flight)."""
    live = cluster.ray_nodes.filter(status__in=RayNodeStatus.live()).select_related("node__cluster")
    ray_nodes = [ray_node for ray_node in live if not stop_in_flight(ray_node)]
    for ray_node in ray_nodes:
        stop_ray_node(cluster, ray_node, actor)
    if ray_nodes:
        record_event(cluster, "stopping", f"Stopping {len(ray_nodes)} Ray node(s): {why}")


def drain_worker(cluster: RayCluster, worker: RayNode, head: RayNode | None, actor: Any, *, why: str) -> None:
    """Ray-drain `worker` through the head; its container is stopped once the drain finished."""
    if head is None or not worker.ray_node_id:
        stop_ray_node(cluster, worker, actor)
        return
    payload = protocol.RayNodeDrainPayload(
        cluster_id=str(cluster.pk),
        member_id=str(worker.pk),
        ray_node_id=worker.ray_node_id,
        runtime=cluster.runtime,
        head_member_id=str(head.pk),
        gcs_port=head_gcs_port(cluster),
        reason=why[:200],
    )
    try:
        command = dispatch(actor, head.node, "ray.node.drain", payload)
    except IllegalTransition:
        stop_ray_node(cluster, worker, actor)
        return
    ray_node_set_status(worker, RayNodeStatus.DRAINING, pending_command=command)

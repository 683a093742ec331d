"""Ray on the fleet's own machines (the docker and process runtimes): head placement with its ports, and
workers on the other nodes."""

from __future__ import annotations

from collections import Counter
from typing import Any

from agent import protocol
from fleet.models import Node
from kernel.exceptions import IllegalTransition, QuotaExceeded
from raymgr.models import RayCluster, RayNode, RayNodeRole, RayNodeStatus, RayRuntime
from raymgr.placement import PlacementError, choose_head_node, choose_worker_node
from raymgr.quotas import admit_ray_node
from raymgr.services.common import PORT_HOLDING, S, dispatch, record_event
from raymgr.services.transitions import ray_cluster_transition, ray_node_set_status


def _ports_in_use(cluster: RayCluster) -> dict[Any, set[int]]:
    rows = (
        RayNode.objects.filter(
            role=RayNodeRole.HEAD,
            status__in=RayNodeStatus.live(),
            ray_cluster__status__in=PORT_HOLDING,
            node__cluster_id=cluster.compute_cluster_id,
        )
        .exclude(ray_cluster=cluster)
        .values_list("node_id", "ray_cluster__head_gcs_port", "ray_cluster__dashboard_port")
    )
    used: dict[Any, set[int]] = {}
    for node_id, gcs, dashboard in rows:
        used.setdefault(node_id, set()).update(port for port in (gcs, dashboard) if port)
    return used


def launch_host_head(cluster: RayCluster, actor: Any) -> None:
    """Place the head on the fittest node whose ports are free and start it there.

    Without a GCS port asked for, the payload's ``gcs_port`` is 0: the agent picks a free port on its
    machine (never one something else listens on, e.g. Redis's 6379) and reports it with the head's start.
    """
    nodes = list(Node.objects.filter(cluster_id=cluster.compute_cluster_id).select_related("cluster"))
    try:
        node = choose_head_node(
            nodes,
            ports_in_use=_ports_in_use(cluster),
            gcs_port=cluster.gcs_port,
            dashboard_port=cluster.dashboard_port,
        )
    except PlacementError as exc:
        record_event(cluster, "placement_failed", exc.message, code=exc.code)
        ray_cluster_transition(cluster=cluster, to=S.FAILED, reason=exc.message)
        return
    num_gpus = node.gpu_count if cluster.runtime == RayRuntime.DOCKER else 0
    # QuotaExceeded propagates: the create or start that placed the head is refused (409), nothing written
    requested = admit_ray_node(cluster, node, RayNodeRole.HEAD, num_gpus)
    head = RayNode.objects.create(ray_cluster=cluster, node=node, role=RayNodeRole.HEAD, **requested)
    payload = protocol.RayHeadStartPayload(
        cluster_id=str(cluster.pk),
        member_id=str(head.pk),
        ray_version=cluster.ray_version,
        image=cluster.image_for(node),
        runtime=cluster.runtime,
        gcs_port=cluster.gcs_port or 0,
        dashboard_port=cluster.dashboard_port,
        num_gpus=num_gpus,
    )
    try:
        command = dispatch(actor, node, "ray.head.start", payload)
    except IllegalTransition as exc:
        ray_node_set_status(head, RayNodeStatus.FAILED, failure_reason=str(exc))
        ray_cluster_transition(cluster=cluster, to=S.FAILED, reason=f"The head cannot start on {node.name}: {exc}")
        return
    RayNode.objects.filter(pk=head.pk).update(start_command=command)
    RayCluster.objects.filter(pk=cluster.pk).update(
        head_node=node, head_hostname=node.hostname, head_gcs_port=cluster.gcs_port
    )
    record_event(
        cluster,
        "placement",
        f"Head placed on {node.name} ({max(0, node.memory_total_mb - node.memory_used_mb)} MB free RAM)",
        node_id=str(node.pk),
        command_id=str(command.pk),
    )


def worker_candidates(cluster: RayCluster) -> tuple[list[Node], Counter]:
    """The compute cluster's nodes and how many live Ray nodes of this cluster each runs."""
    nodes = list(Node.objects.filter(cluster_id=cluster.compute_cluster_id).select_related("cluster"))
    occupied = Counter(cluster.ray_nodes.filter(status__in=RayNodeStatus.live()).values_list("node_id", flat=True))
    return nodes, occupied


def next_worker_node(cluster: RayCluster, nodes: list[Node], occupied: Counter) -> Node | None:
    """The node the next worker goes to, or None when none can take one."""
    node = choose_worker_node(
        nodes,
        head_node_id=cluster.head_node_id,
        ray_nodes_per_node=occupied,
        share_nodes=cluster.runtime == RayRuntime.PROCESS,
    )
    return node  # type: ignore[return-value]


def start_workers(cluster: RayCluster, actor: Any, count: int, *, why: str) -> list[RayNode]:
    """Place and start `count` workers (fewer, with an event, when nodes run out); each is admitted against
    the workspace's quotas first, and at the quota it stops, recording why (`RayCluster.quota_block`)."""
    if count <= 0 or not cluster.gcs_address:
        return []
    nodes, occupied = worker_candidates(cluster)
    started: list[RayNode] = []
    for _ in range(count):
        node = next_worker_node(cluster, nodes, occupied)
        if node is None:
            record_event(
                cluster,
                "placement_failed",
                f"No node can take another worker ({len(started)} of {count} started): every other online node "
                "already runs one.",
                wanted=count,
                started=len(started),
            )
            break
        num_gpus = node.gpu_count if cluster.runtime == RayRuntime.DOCKER else 0
        try:
            requested = admit_ray_node(cluster, node, RayNodeRole.WORKER, num_gpus)
        except QuotaExceeded as exc:  # stop at the quota; the cluster page says why workers are not added
            quota_block_set(cluster, str(exc), detail=f"{len(started)} of {count} worker(s) started ({why})")
            return started
        worker = RayNode.objects.create(ray_cluster=cluster, node=node, role=RayNodeRole.WORKER, **requested)
        payload = protocol.RayWorkerStartPayload(
            cluster_id=str(cluster.pk),
            member_id=str(worker.pk),
            ray_version=cluster.ray_version,
            image=cluster.image_for(node),
            runtime=cluster.runtime,
            head_address=cluster.gcs_address,
            num_gpus=num_gpus,
        )
        try:
            command = dispatch(actor, node, "ray.worker.start", payload)
        except IllegalTransition as exc:
            ray_node_set_status(worker, RayNodeStatus.FAILED, failure_reason=str(exc))
            occupied[node.pk] += 1
            continue
        RayNode.objects.filter(pk=worker.pk).update(start_command=command)
        occupied[node.pk] += 1
        started.append(worker)
        record_event(cluster, "worker_starting", f"Starting a worker on {node.name} ({why})", node_id=str(node.pk))
    quota_block_set(cluster, "")
    return started


def quota_block_set(cluster: RayCluster, reason: str, *, detail: str = "") -> None:
    """Record why the workspace's quota holds workers back ("" when nothing does); a new reason is also an
    event on the cluster's timeline (with `detail`). One UPDATE only when it changes."""
    current = RayCluster.objects.filter(pk=cluster.pk).values_list("quota_block", flat=True).first()
    if current is None or current == reason:
        return
    RayCluster.objects.filter(pk=cluster.pk).update(quota_block=reason)
    cluster.quota_block = reason
    if reason:
        record_event(cluster, "quota", f"Workers not added ({detail}): {reason}")

"""The Ray autoscaler: one decision per running cluster (`ray_cluster_autoscale`), carried out, and the beat
pass over every cluster (`autoscale_pass`) that also sweeps stuck deletions."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from agent import protocol
from fleet.models import Command, CommandStatus
from kernel import metrics
from kernel.exceptions import IllegalTransition
from raymgr import autoscaler
from raymgr.endpoint_groups import ranks_on
from raymgr.models import RayCluster, RayNode, RayNodeRole, RayNodeStatus
from raymgr.services.common import (
    DELETE_GRACE,
    STATUS_LOG_LINES,
    STATUS_MAX_AGE,
    STOP_GRACE,
    S,
    dispatch,
    head_gcs_port,
    operator_for,
    record_event,
    resource_amounts,
    running_head,
)
from raymgr.services.hosts import next_worker_node, quota_block_set, start_workers, worker_candidates
from raymgr.services.launch import drain_worker
from raymgr.services.lifecycle import ray_cluster_finish_delete, ray_cluster_finish_stop

logger = logging.getLogger(__name__)


def _worker_shape(cluster: RayCluster, workers: list[RayNode]) -> dict[str, float]:
    nodes, occupied = worker_candidates(cluster)
    node = next_worker_node(cluster, nodes, occupied)
    if node is not None and node.cpu_count:
        shape = {"CPU": float(node.cpu_count)}
        if node.gpu_count:
            shape["GPU"] = float(node.gpu_count)
        return shape
    for worker in workers:
        if worker.resources:
            return {k: v for k, v in worker.resources.items() if k in ("CPU", "GPU")}
    return {"CPU": 1.0}


def ray_cluster_autoscale(*, cluster: RayCluster) -> autoscaler.Decision | None:
    """One autoscaler pass for a running cluster: decide, record the decision, carry it out, ask for status.

    The decision uses the latest stored `ray.status` (pending demand, per-worker idle time) once: a status
    already decided on, or older than STATUS_MAX_AGE, is not reused; then only min/max bounds apply (no
    demand, nobody idle). Decisions that change nothing are recorded only when their reason changed.
    """
    with transaction.atomic():
        cluster = RayCluster.objects.select_for_update(skip_locked=True).filter(pk=cluster.pk).first()
        if cluster is None or cluster.status != S.RUNNING:
            return None
        actor = operator_for(cluster)
        if actor is None:
            record_event(cluster, "autoscaler", "Autoscaler skipped: no Owner or Admin left in the workspace")
            return None
        if cluster.is_kuberay:  # KubeRay's autoscaler sizes the worker group: only keep the status fresh
            head = running_head(cluster)
            if head is not None:
                _request_status(cluster, head, actor)
            return None
        now = timezone.now()
        status = cluster.last_status or {}
        fresh = bool(
            cluster.last_status_at
            and now - cluster.last_status_at <= STATUS_MAX_AGE
            and (cluster.last_decided_status_at is None or cluster.last_status_at > cluster.last_decided_status_at)
        )
        workers = list(
            cluster.ray_nodes.filter(role=RayNodeRole.WORKER, status__in=RayNodeStatus.live()).select_related(
                "node__cluster"
            )
        )
        shape = _worker_shape(cluster, workers)
        pinned = ranks_on([str(w.pk) for w in workers])
        states = [
            autoscaler.WorkerState(
                worker_id=str(w.pk),
                idle_s=w.idle_s if fresh else 0.0,
                resources=w.resources or shape,
                available=(w.available if fresh and w.resources else None),
                draining=w.status in (RayNodeStatus.DRAINING, RayNodeStatus.STOPPING),
                starting=w.status == RayNodeStatus.STARTING,
                pinned=str(w.pk) in pinned,
            )
            for w in workers
        ]
        head = running_head(cluster)
        demand = autoscaler.ClusterDemand(
            pending=[resource_amounts(b) for b in status.get("pending", [])] if fresh else [],
            head_free=(head.available if fresh and head is not None else {}),
            worker_shape=shape,
        )
        policy = autoscaler.ScalingPolicy(
            min_workers=cluster.min_workers, max_workers=cluster.max_workers, idle_timeout_s=cluster.idle_timeout_s
        )
        decision = autoscaler.decide(policy, states, demand)
        _record_decision(cluster, decision, fresh=fresh)
        transaction.on_commit(lambda: _count_decision(decision))
        if fresh:
            RayCluster.objects.filter(pk=cluster.pk).update(last_decided_status_at=cluster.last_status_at)
        if decision.add:  # stops at the workspace's quota, saying so on the cluster page
            start_workers(cluster, actor, decision.add, why="autoscaler")
        elif cluster.quota_block:
            quota_block_set(cluster, "")  # no worker wanted: the quota holds nothing back any more
        by_id = {str(w.pk): w for w in workers}
        for worker_id in decision.remove:
            drain_worker(cluster, by_id[worker_id], head, actor, why="autoscaler: idle")
        if head is not None:
            _request_status(cluster, head, actor)
        return decision


def _count_decision(decision: autoscaler.Decision) -> None:
    """The decision in the Prometheus counters (once it is committed, i.e. carried out)."""
    metrics.AUTOSCALER_DECISIONS.labels(action=metrics.autoscaler_action(decision.add, len(decision.remove))).inc()
    metrics.AUTOSCALER_WORKERS.labels(change="added").inc(decision.add)
    metrics.AUTOSCALER_WORKERS.labels(change="removed").inc(len(decision.remove))


def _record_decision(cluster: RayCluster, decision: autoscaler.Decision, *, fresh: bool) -> None:
    message = decision.summary()
    if not decision.changes:
        last = cluster.events.filter(kind="autoscaler").values_list("message", flat=True).first()
        if last == message:
            return
    record_event(
        cluster,
        "autoscaler",
        message,
        add=decision.add,
        remove=decision.remove,
        reasons=decision.reasons,
        queued=decision.queued,
        used_status=fresh,
    )


def _request_status(cluster: RayCluster, head: RayNode, actor: Any) -> Command | None:
    in_flight = Command.objects.filter(
        node_id=head.node_id,
        command_type="ray.status",
        payload__member_id=str(head.pk),
        status__in=[CommandStatus.QUEUED, CommandStatus.DISPATCHED, CommandStatus.RUNNING],
    ).exists()
    if in_flight:
        return None
    payload = protocol.RayStatusPayload(
        cluster_id=str(cluster.pk),
        member_id=str(head.pk),
        runtime=cluster.runtime,
        gcs_port=head_gcs_port(cluster),
        include_logs=True,
        log_lines=STATUS_LOG_LINES,
    )
    try:
        return dispatch(actor, head.node, "ray.status", payload)
    except IllegalTransition:
        return None


def autoscale_pass() -> int:
    """Beat: one autoscaler pass over every running Ray cluster, and the sweep of stuck stops and deletions.

    Ray clusters on a compute cluster whose automation is paused (suspected partition) are skipped.

    Returns how many clusters were autoscaled.
    """
    done = 0
    running = RayCluster.objects.filter(status=S.RUNNING).exclude(
        compute_cluster__automation_paused_until__gt=timezone.now()  # partition pause: no rescheduling
    )
    for cluster in running.order_by("pk"):
        try:
            if ray_cluster_autoscale(cluster=cluster) is not None:
                done += 1
        except Exception:  # one broken cluster must not stop the others
            logger.exception("autoscaler pass failed for Ray cluster %s", cluster.pk)
    cutoff = timezone.now() - STOP_GRACE
    for cluster in RayCluster.objects.filter(status=S.STOPPING, status_changed_at__lt=cutoff):
        with transaction.atomic():
            ray_cluster_finish_stop(cluster, force=True)
    cutoff = timezone.now() - DELETE_GRACE
    for cluster in RayCluster.objects.filter(status=S.DELETING, status_changed_at__lt=cutoff):
        with transaction.atomic():
            ray_cluster_finish_delete(cluster, force=True)
    return done

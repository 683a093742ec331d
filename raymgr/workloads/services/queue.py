"""The Ray job queue's writes (rules in `raymgr.workloads.queue`): start the queued jobs of a Ray cluster that
fit, on an event; fail those that waited past their `queue_timeout_s`.

Events that may let a queued job start, each enqueueing `raymgr.tasks.dispatch_ray_queue` for the cluster on
commit: a job created, a submitted job finished or cancelled (capacity freed), a Ray node of the cluster
running (capacity added: the cluster started, or the autoscaler added a worker once the workspace's quota
let it). The beat's poll pass runs the same dispatch, a net for an event lost with a broker, never a
retry loop of its own: one pass takes the queue in its order, whatever it is asked by.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction
from django.utils import timezone

from raymgr.models import RayCluster, RayClusterStatus, RayNode, RayNodeStatus
from raymgr.workloads import queue, render
from raymgr.workloads.models import TrainingJob
from raymgr.workloads.selectors import MODELS, Row, queue_entry, queue_waiting
from raymgr.workloads.services.head import submit_job
from raymgr.workloads.services.jobs import J, gpu_capacity, job_transition


def cluster_free(cluster: RayCluster) -> queue.Free:
    """What `cluster` has free: its running Ray nodes' CPUs and GPUs (as Ray reports them, else as
    admitted) less what its submitted, unfinished jobs ask for."""
    cpus = gpus = 0.0
    for node in RayNode.objects.filter(ray_cluster=cluster, status=RayNodeStatus.RUNNING):
        reported = node.resources or {}
        cpus += float(reported.get("CPU", node.req_cpus))
        gpus += float(reported.get("GPU", node.req_gpus))
    busy = False
    for model in MODELS:
        for row in model.objects.filter(ray_cluster=cluster, status__in=J.active(), submitted_at__isnull=False):
            cpus -= row.cpus_needed
            gpus -= row.gpus_needed
            busy = True
    return queue.Free(cpus=cpus, gpus=gpus, busy=busy)


def _submit(row: Row, actor: Any) -> bool:
    submission = render.training_submission(row) if isinstance(row, TrainingJob) else render.tune_submission(row)
    if submit_job(actor, row.ray_cluster, submission) is None:
        return False
    now = timezone.now()
    type(row).objects.filter(pk=row.pk).update(submitted_at=now, queue_reason="")
    row.submitted_at, row.queue_reason = now, ""
    return True


def _set_reason(row: Row, reason: str) -> None:
    if row.queue_reason != reason:
        type(row).objects.filter(pk=row.pk).update(queue_reason=reason)
        row.queue_reason = reason


def ray_queue_dispatch(*, cluster_id: Any, actor: Any = None) -> list[Row]:
    """Start the queued jobs of the Ray cluster that fit now, in queue order, and store why each other one
    waits; returns the jobs submitted. Dispatches of one cluster take turns (its row is locked)."""
    from raymgr.services import operator_for

    with transaction.atomic():
        cluster = RayCluster.objects.select_for_update().filter(pk=cluster_id).first()
        if cluster is None:
            return []
        rows = queue_waiting(cluster.pk, lock=True)
        if not rows:
            return []
        actor = actor or operator_for(cluster)
        if cluster.status != RayClusterStatus.RUNNING:
            for row in rows:
                _set_reason(row, f"Waiting for Ray cluster {cluster.name} to run (it is {cluster.status}).")
            return []
        capacity = gpu_capacity(cluster)
        free = cluster_free(cluster)
        started: list[Row] = []
        ahead = 0
        blocked: Row | None = None
        for row in rows:
            wanted = queue_entry(row)
            least = row.gpus_needed if isinstance(row, TrainingJob) else row.gpus_per_trial  # one trial at least
            if least > capacity:
                _set_reason(
                    row,
                    f"Needs {wanted.gpus:g} GPUs; cluster {cluster.name} can have at most {capacity:g}. "
                    "Queued until it can.",
                )
                continue
            if blocked is None and queue.fits(wanted, free):
                if _submit(row, actor):
                    started.append(row)
                    free = queue.take(wanted, free)
                    continue
                _set_reason(row, f"Ray cluster {cluster.name} has no running head yet.")
                blocked = row
                continue
            if blocked is None:
                blocked = row
                _set_reason(row, _capacity_reason(cluster, wanted, free))
            else:
                _set_reason(row, _behind_reason(cluster, ahead))
            ahead += 1
        return started


def _capacity_reason(cluster: RayCluster, wanted: queue.Entry, free: queue.Free) -> str:
    reason = (
        f"First in the queue of Ray cluster {cluster.name}: needs {wanted.cpus:g} CPUs and {wanted.gpus:g} GPUs; "
        f"{max(free.cpus, 0):g} CPUs and {max(free.gpus, 0):g} GPUs are free."
    )
    if cluster.quota_block:
        reason += f" The workspace's quota holds back more workers: {cluster.quota_block}"
    return reason


def _behind_reason(cluster: RayCluster, ahead: int) -> str:
    jobs = "job" if ahead == 1 else "jobs"
    return f"Waiting in the queue of Ray cluster {cluster.name} behind {ahead} {jobs} of higher or equal priority."


def queue_expire(*, now: dt.datetime | None = None) -> int:
    """Fail the queued jobs that waited longer than their `queue_timeout_s`; returns how many."""
    now = now or timezone.now()
    failed = 0
    for model in MODELS:
        rows = model.objects.filter(status=J.QUEUED, submitted_at__isnull=True, queue_timeout_s__isnull=False)
        for row in rows:
            if row.created_at + dt.timedelta(seconds=row.queue_timeout_s) > now:
                continue
            with transaction.atomic():
                locked = model.objects.select_for_update().filter(pk=row.pk, status=J.QUEUED).first()
                if locked is None or locked.submitted_at is not None:
                    continue
                why = f" ({locked.queue_reason})" if locked.queue_reason else ""
                job_transition(
                    locked,
                    J.FAILED,
                    failure_reason=f"Waited in the queue longer than its queue_timeout of {locked.queue_timeout_s} s"
                    f"{why}.",
                )
                failed += 1
    return failed

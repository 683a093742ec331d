"""Reads for Ray workloads, scoped to the requesting user's workspaces; the dashboard's card counts; the
workloads of one Ray cluster (its Jobs tab)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from itertools import chain
from typing import Any

from django.db.models import Count, Q, QuerySet

from raymgr.models import RayCluster, RayClusterStatus
from raymgr.workloads import queue
from raymgr.workloads.models import JobStatus, ServeDeployment, ServeStatus, TrainingJob, TuneExperiment
from tenancy.selectors import scope_to_user


def training_job_list(*, user: Any) -> QuerySet[TrainingJob]:
    """Training jobs of `user`'s workspaces, newest first."""
    return scope_to_user(TrainingJob.objects.select_related("ray_cluster", "workspace"), user=user)


def tune_experiment_list(*, user: Any) -> QuerySet[TuneExperiment]:
    """Tune experiments of `user`'s workspaces with trial counts (`n_trials`, `n_trials_done`)."""
    rows = TuneExperiment.objects.select_related("ray_cluster", "workspace").annotate(
        n_trials=Count("trials"), n_trials_done=Count("trials", filter=Q(trials__status__in=["TERMINATED", "ERROR"]))
    )
    return scope_to_user(rows, user=user)


def serve_deployment_list(*, user: Any) -> QuerySet[ServeDeployment]:
    """Serve deployments of `user`'s workspaces."""
    return scope_to_user(ServeDeployment.objects.select_related("ray_cluster", "workspace"), user=user)


def dashboard_counts(*, user: Any) -> dict[str, dict[str, int]]:
    """The four Ray dashboard cards: clusters, deployments, training jobs, Tune experiments (4 queries)."""
    clusters = scope_to_user(RayCluster.objects.all(), user=user).aggregate(
        total=Count("pk"),
        running=Count("pk", filter=Q(status=RayClusterStatus.RUNNING)),
        stopped=Count("pk", filter=Q(status=RayClusterStatus.STOPPED)),
    )
    deployments = serve_deployment_list(user=user).aggregate(
        running=Count("pk", filter=Q(status=ServeStatus.RUNNING)),
        degraded=Count("pk", filter=Q(status=ServeStatus.DEGRADED)),
        unhealthy=Count("pk", filter=Q(status__in=[ServeStatus.UNHEALTHY, ServeStatus.FAILED])),
    )
    jobs = training_job_list(user=user).aggregate(
        running=Count("pk", filter=Q(status=JobStatus.RUNNING)),
        completed=Count("pk", filter=Q(status=JobStatus.SUCCEEDED)),
        failed=Count("pk", filter=Q(status=JobStatus.FAILED)),
    )
    running_tune = scope_to_user(TuneExperiment.objects.filter(status=JobStatus.RUNNING), user=user).aggregate(
        running=Count("pk", distinct=True),
        n_trials=Count("trials"),
        n_trials_done=Count("trials", filter=Q(trials__status__in=["TERMINATED", "ERROR"])),
    )
    return {"clusters": clusters, "deployments": deployments, "jobs": jobs, "tune": running_tune}


@dataclass(frozen=True)
class ClusterWorkload:
    """One training job, Tune experiment or Serve deployment of a Ray cluster, as its Jobs tab lists it."""

    kind: str  # "Training job" | "Tune experiment" | "Serve deployment"
    pk: Any
    name: str
    status: str
    status_display: str
    submission_id: str  # the Ray job's submission id on the head ('' until submitted)
    since: dt.datetime
    active: bool  # not finished (a serving deployment counts as active)
    changing: bool  # its status may change any second (queued, running, deploying, ...)
    url_name: str  # the page route, e.g. "raymgr:training_detail"


SERVE_CHANGING = (ServeStatus.PENDING, ServeStatus.DEPLOYING, ServeStatus.STOPPING)


def cluster_workload_list(*, cluster: RayCluster, finished: int = 10) -> list[ClusterWorkload]:
    """The cluster's active workloads (all three kinds), then its `finished` latest finished ones (3 queries)."""
    jobs = [
        ClusterWorkload(
            kind=kind,
            pk=row.pk,
            name=row.name,
            status=row.status,
            status_display=row.get_status_display(),
            submission_id=row.submission_id,
            since=row.status_changed_at,
            active=row.status in JobStatus.active(),
            changing=row.status in JobStatus.active(),
            url_name=url_name,
        )
        for kind, url_name, rows in (
            ("Training job", "raymgr:training_detail", cluster.training_jobs.all()),
            ("Tune experiment", "raymgr:tune_detail", cluster.tune_experiments.all()),
        )
        for row in rows
    ]
    serve = [
        ClusterWorkload(
            kind="Serve deployment",
            pk=row.pk,
            name=row.name,
            status=row.status,
            status_display=row.get_status_display(),
            submission_id=row.submission_id,
            since=row.status_changed_at,
            active=row.status in ServeStatus.live(),
            changing=row.status in SERVE_CHANGING,
            url_name="raymgr:serve_detail",
        )
        for row in cluster.serve_deployments.all()
    ]
    rows = sorted(chain(jobs, serve), key=lambda w: w.since, reverse=True)
    return [w for w in rows if w.active] + [w for w in rows if not w.active][:finished]


# ---- the Ray job queue ----

Row = TrainingJob | TuneExperiment
MODELS: tuple[type[TrainingJob] | type[TuneExperiment], ...] = (TrainingJob, TuneExperiment)


def queue_entry(row: Row) -> queue.Entry:
    """`row` as the queue sees it."""
    return queue.Entry(
        key=row.submission_id or str(row.pk),
        workspace_id=row.workspace_id,
        priority=row.priority,
        created_at=row.created_at,
        cpus=row.cpus_needed,
        gpus=row.gpus_needed,
    )


def queue_waiting(cluster_id: Any, *, lock: bool = False) -> list[Row]:
    """The cluster's jobs waiting in its queue (queued, not yet submitted to Ray), in queue order (2 queries);
    `lock`: their rows locked (SELECT ... FOR UPDATE)."""
    rows: list[Row] = []
    for model in MODELS:
        qs = model.objects.filter(ray_cluster_id=cluster_id, status=JobStatus.QUEUED, submitted_at__isnull=True)
        rows.extend(qs.select_for_update() if lock else qs)
    by_key = {queue_entry(row).key: row for row in rows}
    return [by_key[e.key] for e in queue.order(queue_entry(row) for row in rows)]


def queue_positions(cluster_id: Any) -> dict[Any, int]:
    """Each waiting job's position (1 = next) in the queue of the Ray cluster, by the job's pk."""
    return {row.pk: index for index, row in enumerate(queue_waiting(cluster_id), start=1)}


def with_queue_positions(rows: list[Any]) -> list[Any]:
    """Set `queue_position` on each row (None unless it waits in its cluster's queue): 2 queries per cluster
    with waiting rows among `rows`."""
    positions: dict[Any, dict[Any, int]] = {}
    for row in rows:
        row.queue_position = None
        if isinstance(row, TrainingJob | TuneExperiment) and row.status == JobStatus.QUEUED and not row.submitted_at:
            if row.ray_cluster_id not in positions:
                positions[row.ray_cluster_id] = queue_positions(row.ray_cluster_id)
            row.queue_position = positions[row.ray_cluster_id].get(row.pk)
    return rows

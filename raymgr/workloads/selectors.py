"""Reads for Ray workloads, scoped to the requesting user's workspaces; the dashboard's card counts; the
workloads of one Ray cluster (its Jobs tab)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from itertools import chain
from typing import Any

from django.db.models import Count, Q, QuerySet

from raymgr.models import RayCluster, RayClusterStatus
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

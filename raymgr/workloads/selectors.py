"""Reads for Ray workloads, scoped to the requesting user's workspaces; the dashboard's card counts."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q, QuerySet

from cleverthis.tenancy.selectors import scope_to_user
from raymgr.models import RayCluster, RayClusterStatus
from raymgr.workloads.models import JobStatus, ServeDeployment, ServeStatus, TrainingJob, TuneExperiment


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

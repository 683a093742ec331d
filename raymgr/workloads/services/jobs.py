"""Machinery shared by training jobs and Tune experiments: the job state machine, validation and saving,
queueing until the cluster fits, cancelling."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from fleet import enqueue
from fleet.models import Node
from kernel.exceptions import IllegalTransition
from kernel.rows import save_unique_name
from raymgr.models import RayCluster
from raymgr.workloads.models import JobStatus, TrainingJob, TuneExperiment
from raymgr.workloads.services.head import send_to_head
from tenancy.models import Workspace

J = JobStatus
JOB_TRANSITIONS: dict[str, frozenset[str]] = {
    J.QUEUED: frozenset({J.RUNNING, J.SUCCEEDED, J.FAILED, J.CANCELLED}),
    J.RUNNING: frozenset({J.SUCCEEDED, J.FAILED, J.CANCELLED}),
    J.SUCCEEDED: frozenset(),
    J.FAILED: frozenset(),
    J.CANCELLED: frozenset(),
}
RAY_JOB_STATES = {"PENDING": J.QUEUED, "RUNNING": J.RUNNING, "SUCCEEDED": J.SUCCEEDED, "FAILED": J.FAILED}
LOG_LINES = 300
DISPATCH_RAY_QUEUE = "raymgr.tasks.dispatch_ray_queue"


def job_transition(row: TrainingJob | TuneExperiment, to: str, **fields: Any) -> None:
    """Move a training job / Tune experiment to `to` (conditional UPDATE); `IllegalTransition` if not allowed."""
    if row.status == to:
        if fields:
            type(row).objects.filter(pk=row.pk).update(**fields)
        for name, value in fields.items():
            setattr(row, name, value)
        return
    allowed_from = [state for state, targets in JOB_TRANSITIONS.items() if to in targets]
    if to in (J.SUCCEEDED, J.FAILED, J.CANCELLED):
        fields.setdefault("finished_at", timezone.now())
    if to != J.QUEUED:  # why it waited is history once it left the queue
        fields.setdefault("queue_reason", "")
    updated = (
        type(row)
        .objects.filter(pk=row.pk, status__in=allowed_from)
        .update(status=to, status_changed_at=timezone.now(), **fields)
    )
    if updated != 1:
        current = type(row).objects.filter(pk=row.pk).values_list("status", flat=True).first()
        raise IllegalTransition(f"A {current or 'deleted'} job cannot become {to}.")
    row.status = to
    for name, value in fields.items():
        setattr(row, name, value)
    if to in (J.SUCCEEDED, J.FAILED, J.CANCELLED):  # capacity (or a place in the queue) freed: an event
        enqueue_dispatch(row.ray_cluster_id)


def enqueue_dispatch(cluster_id: Any) -> None:
    """Once the transaction commits, have a worker start the queued jobs of the Ray cluster that now fit."""
    enqueue.on_commit(DISPATCH_RAY_QUEUE, str(cluster_id))


def check_cluster(workspace: Workspace, ray_cluster: Any, errors: dict[str, str]) -> None:
    """Add an error unless `ray_cluster` is a Ray cluster of `workspace`."""
    if not isinstance(ray_cluster, RayCluster) or ray_cluster.workspace_id != workspace.pk:
        errors["ray_cluster"] = "No such Ray cluster in this workspace."


def full_clean(row: models.Model, errors: dict[str, Any]) -> None:
    """Run the model's field validation, merged into `errors`; raise `ValidationError` if any."""
    try:
        row.full_clean(exclude=["workspace", "ray_cluster", "created_by"], validate_constraints=False)
    except ValidationError as exc:
        for field_name, messages in exc.message_dict.items():
            errors.setdefault(field_name, messages)
    if errors:
        raise ValidationError(errors)


def save_new(row: models.Model) -> None:
    """Insert `row`; a name already used in the workspace is a `ValidationError` on `name`."""
    save_unique_name(row, message="This name is already used in the workspace.", force_insert=True)


def gpu_capacity(cluster: RayCluster) -> float:
    """The most GPUs the Ray cluster can have: its head node plus its largest `max_workers` other nodes."""
    counts = list(Node.objects.filter(cluster_id=cluster.compute_cluster_id).values_list("pk", "gpu_count"))
    head = [g for pk, g in counts if pk == cluster.head_node_id]
    others = sorted((g for pk, g in counts if pk != cluster.head_node_id), reverse=True)
    return float(sum(head) + sum(others[: cluster.max_workers]))


def job_cancel(row: TrainingJob | TuneExperiment, actor: Any) -> None:
    """Cancel a training job / experiment: at once if not yet on Ray, else by stopping its Ray job."""
    if row.status not in J.active():
        raise IllegalTransition(f"A {row.status} job cannot be cancelled.")
    if row.submitted_at is None:
        job_transition(row, J.CANCELLED, cancel_requested=True)
        return
    type(row).objects.filter(pk=row.pk).update(cancel_requested=True)
    row.cancel_requested = True
    if send_to_head(actor, row.ray_cluster, "ray.job.stop", submission_id=row.submission_id) is None:
        job_transition(row, J.CANCELLED, failure_reason="Cancelled; the Ray cluster was not running.")

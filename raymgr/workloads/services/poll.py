"""The poll pass (Celery beat): fail jobs queued past their timeout, dispatch the queues (a net under the
events that start queued jobs), ask the heads for job and Serve status."""

from __future__ import annotations

from django.db import transaction

from fleet.models import Command
from raymgr.services import operator_for
from raymgr.workloads.models import ServeDeployment, ServeStatus, TrainingJob, TuneExperiment
from raymgr.workloads.services.head import IN_FLIGHT, in_flight, send_to_head
from raymgr.workloads.services.jobs import LOG_LINES, J
from raymgr.workloads.services.queue import queue_expire, ray_queue_dispatch
from raymgr.workloads.services.serve import serve_deployment_deploy


def workloads_poll() -> int:
    """Beat: submit queued jobs that now fit, ask the heads for job and Serve status; returns commands sent."""
    queue_expire()
    sent = 0
    waiting: set = set()
    for model in (TrainingJob, TuneExperiment):
        queued = model.objects.filter(status=J.QUEUED, submitted_at__isnull=True)
        waiting.update(queued.values_list("ray_cluster_id", flat=True))
    for cluster_id in sorted(waiting, key=str):
        sent += len(ray_queue_dispatch(cluster_id=cluster_id))
    for model in (TrainingJob, TuneExperiment):
        rows = model.objects.filter(status__in=J.active(), submitted_at__isnull=False)
        for row in rows.select_related("ray_cluster", "workspace").order_by("created_at"):
            actor = operator_for(row.ray_cluster)
            with transaction.atomic():
                if not in_flight("ray.job.submit", row.submission_id) and not in_flight(
                    "ray.job.status", row.submission_id
                ):  # never ask about a job before the head has confirmed its submission
                    command = send_to_head(
                        actor, row.ray_cluster, "ray.job.status", submission_id=row.submission_id, log_lines=LOG_LINES
                    )
                    sent += command is not None
    deployments = ServeDeployment.objects.filter(status__in=ServeStatus.live()).select_related("ray_cluster")
    for deployment in deployments.order_by("created_at"):
        actor = operator_for(deployment.ray_cluster)
        with transaction.atomic():
            if deployment.status == ServeStatus.PENDING:
                serve_deployment_deploy(deployment, actor)
                sent += deployment.status == ServeStatus.DEPLOYING
                continue
            if in_flight("ray.job.submit", deployment.submission_id):
                continue  # the deploy (or delete) job is not on the head yet
            busy = deployment.status in (ServeStatus.DEPLOYING, ServeStatus.STOPPING)
            if busy and not in_flight("ray.job.status", deployment.submission_id):
                command = send_to_head(
                    actor, deployment.ray_cluster, "ray.job.status", submission_id=deployment.submission_id
                )
                sent += command is not None
            if deployment.status != ServeStatus.STOPPING and not _serve_status_in_flight(deployment):
                command = send_to_head(actor, deployment.ray_cluster, "ray.serve.status", app_name=deployment.app_name)
                sent += command is not None
    return sent


def _serve_status_in_flight(deployment: ServeDeployment) -> bool:
    return Command.objects.filter(
        command_type="ray.serve.status", payload__app_name=deployment.app_name, status__in=IN_FLIGHT
    ).exists()

"""Serve deployments: deploy (a short Ray job), stop (another one that deletes the application)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.utils import timezone

from audit.services import created, new, on, operator_action
from fleet.models import Command
from kernel.exceptions import IllegalTransition
from raymgr.models import RayCluster
from raymgr.workloads import render
from raymgr.workloads.models import ServeDeployment, ServeEngine, ServeStatus, TrainingJob
from raymgr.workloads.services.head import submit_job
from raymgr.workloads.services.jobs import check_cluster, full_clean, save_new
from tenancy.mixins import require_editor
from tenancy.models import Workspace


@operator_action(
    "serve_deployment.create",
    target=new("serve_deployment"),
    result=created("serve_deployment"),
)
def serve_deployment_create(
    *,
    actor: AbstractBaseUser,
    workspace: Workspace,
    ray_cluster: RayCluster,
    name: str,
    engine: str = ServeEngine.PYTHON,
    model: str = "",
    checkpoint_job: TrainingJob | None = None,
    checkpoint_path: str = "",
    code: str = "",
    route_prefix: str = "",
    http_port: int = 8000,
    num_replicas: int = 1,
    autoscaling: bool = False,
    min_replicas: int = 1,
    max_replicas: int = 1,
    target_ongoing_requests: float = 2.0,
    cpus_per_replica: float = 1.0,
    gpus_per_replica: float = 0.0,
) -> ServeDeployment:
    """Deploy a model or a training job's checkpoint on Ray Serve (Owner, Admin, Member)."""
    require_editor(actor, workspace, what="run Ray workloads")
    errors: dict[str, Any] = {}
    check_cluster(workspace, ray_cluster, errors)
    if checkpoint_job is not None:
        if checkpoint_job.workspace_id != workspace.pk:
            errors["checkpoint_job"] = "No such training job in this workspace."
        elif not checkpoint_job.checkpoints:
            errors["checkpoint_job"] = "This training job has recorded no checkpoint."
        elif checkpoint_path and checkpoint_path not in [c.get("path") for c in checkpoint_job.checkpoints]:
            errors["checkpoint_path"] = "Not one of the job's checkpoints."
        elif not checkpoint_path:
            checkpoint_path = checkpoint_job.latest_checkpoint
    if engine == ServeEngine.VLLM and not (model or checkpoint_path):
        errors["model"] = "vLLM needs a model id or a checkpoint."
    if autoscaling and isinstance(min_replicas, int) and isinstance(max_replicas, int) and max_replicas < min_replicas:
        errors["max_replicas"] = "Must be at least min_replicas."
    if code:
        try:
            compile(code, "deployment.py", "exec")
        except SyntaxError as exc:
            errors["code"] = f"Python syntax error on line {exc.lineno}: {exc.msg}"
    name = name.strip() if isinstance(name, str) else name
    route = route_prefix or f"/{name}"
    if not isinstance(route, str) or not route.startswith("/"):
        errors["route_prefix"] = "Must start with /."
    deployment = ServeDeployment(
        workspace=workspace,
        ray_cluster=ray_cluster if isinstance(ray_cluster, RayCluster) else None,
        name=name,
        engine=engine,
        model=model or "",
        checkpoint_job=checkpoint_job,
        checkpoint_path=checkpoint_path or "",
        code=code or "",
        route_prefix=route,
        http_port=http_port,
        num_replicas=num_replicas,
        autoscaling=autoscaling,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        target_ongoing_requests=target_ongoing_requests,
        cpus_per_replica=cpus_per_replica,
        gpus_per_replica=gpus_per_replica,
        created_by=actor,
    )
    full_clean(deployment, errors)
    neighbours = ServeDeployment.objects.filter(ray_cluster=ray_cluster, status__in=ServeStatus.live())
    if neighbours.filter(route_prefix=route).exists():
        raise ValidationError({"route_prefix": "Another deployment on this Ray cluster serves this route."})
    other_port = neighbours.exclude(http_port=http_port).values_list("http_port", flat=True).first()
    if other_port is not None:
        raise ValidationError({"http_port": f"Serve on this Ray cluster listens on port {other_port}; use it."})
    save_new(deployment)
    serve_deployment_deploy(deployment, actor)
    return deployment


def serve_deployment_deploy(deployment: ServeDeployment, actor: Any) -> None:
    """Send the deploy job (→ deploying), or note that the Ray cluster is not running yet."""
    submission = render.serve_submission(deployment)
    command = submit_job(actor, deployment.ray_cluster, submission)
    fields: dict[str, Any] = {"submission_id": submission.submission_id}
    if command is None:
        fields["failure_reason"] = f"Waiting for Ray cluster {deployment.ray_cluster.name} to run."
    else:
        fields.update(status=ServeStatus.DEPLOYING, status_changed_at=timezone.now(), failure_reason="")
    ServeDeployment.objects.filter(pk=deployment.pk).update(**fields)
    for name, value in fields.items():
        setattr(deployment, name, value)


@operator_action("serve_deployment.stop", target=on("deployment", "serve_deployment"))
def serve_deployment_stop(*, actor: AbstractBaseUser, deployment: ServeDeployment) -> ServeDeployment:
    """Delete the Serve application from the cluster (a short Ray job); → stopping, then stopped."""
    require_editor(actor, deployment.workspace, what="run Ray workloads")
    deployment = ServeDeployment.objects.select_for_update().select_related("ray_cluster").get(pk=deployment.pk)
    if deployment.status in (ServeStatus.STOPPED, ServeStatus.STOPPING):
        raise IllegalTransition(f"A {deployment.status} deployment cannot be stopped.")
    attempt = Command.objects.filter(
        command_type="ray.job.submit", payload__submission_id__startswith=f"serve-{deployment.pk}-delete"
    ).count()
    submission = render.serve_submission(deployment, action="delete", attempt=attempt)
    command = None
    if deployment.status != ServeStatus.PENDING:
        command = submit_job(actor, deployment.ray_cluster, submission)
    to = ServeStatus.STOPPING if command is not None else ServeStatus.STOPPED
    fields = {"status": to, "status_changed_at": timezone.now()}
    if command is not None:
        fields["submission_id"] = submission.submission_id
    ServeDeployment.objects.filter(pk=deployment.pk).update(**fields)
    deployment.refresh_from_db()
    return deployment

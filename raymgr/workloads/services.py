"""Writes for Ray workloads: training jobs, Tune experiments, Serve deployments. Keyword-only, atomic.

Job state machine (training jobs and Tune experiments, `_job_transition` is the only status writer):

    queued  → running | succeeded | failed | cancelled
    running → succeeded | failed | cancelled
    succeeded, failed, cancelled: final

A job waits `queued` (with `queue_reason`) while its Ray cluster is not running or it needs more GPUs
than the cluster can ever have; the poll pass submits it once it fits. Everything reaches the head as
fleet commands to the head's node (`ray.job.submit`, `ray.job.status`, `ray.job.stop`,
`ray.serve.status`); results come back through `workload_on_command_finished` (fleet's
`command_finished` signal). Serve deploys and deletes are short Ray jobs too.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, models, transaction
from django.utils import timezone

from cleverthis.audit.services import created, new, on, operator_action
from cleverthis.tenancy.models import Workspace
from cleverthis.tenancy.permissions import can_operate
from fleet.models import Command, CommandStatus, Node
from kernel.exceptions import IllegalTransition
from raymgr import services as ray_services
from raymgr.models import RayCluster, RayClusterStatus, RayNode
from raymgr.workloads import health, render
from raymgr.workloads.models import (
    Framework,
    JobStatus,
    ServeDeployment,
    ServeEngine,
    ServeStatus,
    TrainingJob,
    TrainingKind,
    TuneExperiment,
    TuneMode,
    TuneScheduler,
    TuneTrial,
)

logger = logging.getLogger(__name__)

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
IN_FLIGHT = (CommandStatus.QUEUED, CommandStatus.DISPATCHED, CommandStatus.RUNNING)
WORKLOAD_COMMANDS = frozenset({"ray.job.submit", "ray.job.status", "ray.job.stop", "ray.serve.status"})


def _require_operator(actor: Any, workspace: Workspace) -> None:
    if not can_operate(actor, workspace):
        raise PermissionDenied("Only workspace Owners and Admins can run Ray workloads.")


def _job_transition(row: TrainingJob | TuneExperiment, to: str, **fields: Any) -> None:
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


def _check_cluster(workspace: Workspace, ray_cluster: Any, errors: dict[str, str]) -> None:
    if not isinstance(ray_cluster, RayCluster) or ray_cluster.workspace_id != workspace.pk:
        errors["ray_cluster"] = "No such Ray cluster in this workspace."


def _full_clean(row: models.Model, errors: dict[str, Any]) -> None:
    try:
        row.full_clean(exclude=["workspace", "ray_cluster", "created_by"], validate_constraints=False)
    except ValidationError as exc:
        for field_name, messages in exc.message_dict.items():
            errors.setdefault(field_name, messages)
    if errors:
        raise ValidationError(errors)


def _save_new(row: models.Model) -> None:
    try:
        with transaction.atomic():
            row.save(force_insert=True)
    except IntegrityError:
        raise ValidationError({"name": "This name is already used in the workspace."}) from None


# --------------------------------------------------------------------------------------------------
# Talking to the head


def _head(cluster: RayCluster) -> RayNode | None:
    if cluster.status != RayClusterStatus.RUNNING:
        return None
    return ray_services._head(cluster)


def _payload(cluster: RayCluster, head: RayNode, **extra: Any) -> dict[str, Any]:
    return {
        "cluster_id": str(cluster.pk),
        "member_id": str(head.pk),
        "runtime": cluster.runtime,
        "dashboard_port": cluster.dashboard_port,
        "host": cluster.head_service_host,  # kuberay: the head's Service (else the head's own node)
        **extra,
    }


def _send(actor: Any, cluster: RayCluster, command_type: str, **extra: Any) -> Command | None:
    """Dispatch one workload command to the head's node; None when there is no running head."""
    head = _head(cluster)
    if head is None or actor is None:
        return None
    try:
        return ray_services._dispatch(actor, head.node, command_type, _payload(cluster, head, **extra))
    except IllegalTransition:
        return None


def _in_flight(command_type: str, submission_id: str) -> bool:
    return Command.objects.filter(
        command_type=command_type, payload__submission_id=submission_id, status__in=IN_FLIGHT
    ).exists()


def _submit(actor: Any, cluster: RayCluster, submission: render.Submission) -> Command | None:
    return _send(
        actor,
        cluster,
        "ray.job.submit",
        submission_id=submission.submission_id,
        entrypoint=submission.entrypoint,
        files=submission.files,
        runtime_env=submission.runtime_env,
        entrypoint_num_cpus=submission.entrypoint_num_cpus,
        entrypoint_num_gpus=submission.entrypoint_num_gpus,
    )


def gpu_capacity(cluster: RayCluster) -> float:
    """The most GPUs the Ray cluster can have: its head node plus its largest `max_workers` other nodes."""
    counts = list(Node.objects.filter(cluster_id=cluster.compute_cluster_id).values_list("pk", "gpu_count"))
    head = [g for pk, g in counts if pk == cluster.head_node_id]
    others = sorted((g for pk, g in counts if pk != cluster.head_node_id), reverse=True)
    return float(sum(head) + sum(others[: cluster.max_workers]))


def _queue_reason(cluster: RayCluster, gpus_needed: float) -> str:
    if cluster.status != RayClusterStatus.RUNNING:
        return f"Waiting for Ray cluster {cluster.name} to run (it is {cluster.status})."
    capacity = gpu_capacity(cluster)
    if gpus_needed > capacity:
        return f"Needs {gpus_needed:g} GPUs; cluster {cluster.name} can have at most {capacity:g}. Queued until it can."
    return ""


# --------------------------------------------------------------------------------------------------
# Training jobs


@operator_action(
    "training_job.create",
    target=new("training_job"),
    result=created("training_job"),
)
def training_job_create(
    *,
    actor: AbstractBaseUser,
    workspace: Workspace,
    ray_cluster: RayCluster,
    name: str,
    kind: str = TrainingKind.SCRIPT,
    script: str = "",
    entrypoint: str = "",
    framework: str = Framework.NONE,
    config: dict[str, Any] | None = None,
    num_workers: int = 1,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float = 0.0,
    checkpoint_every: int = 1,
    checkpoints_to_keep: int = 2,
    storage_path: str = "",
    source_experiment: TuneExperiment | None = None,
) -> TrainingJob:
    """Create a training job (Owner/Admin) and submit it, or leave it queued with the reason why."""
    _require_operator(actor, workspace)
    errors: dict[str, Any] = {}
    _check_cluster(workspace, ray_cluster, errors)
    config = config if config is not None else {}
    if not isinstance(config, dict):
        errors["config"] = "An object."
        config = {}
    if kind == TrainingKind.SCRIPT:
        if framework != Framework.NONE:
            errors["framework"] = "Frameworks apply to the built-in fine-tune; a script brings its own."
        if not (script or "").strip():
            errors["script"] = "A training script is required."
        else:
            try:
                compile(script, "train.py", "exec")
            except SyntaxError as exc:
                errors["script"] = f"Python syntax error on line {exc.lineno}: {exc.msg}"
    elif kind == TrainingKind.FINETUNE:
        if framework == Framework.NONE:
            errors["framework"] = "Choose PyTorch DDP, FSDP or DeepSpeed for a built-in fine-tune."
        if not config.get("model"):
            errors["config"] = "A built-in fine-tune needs config.model (model id or path) and config.dataset."
        elif not config.get("dataset"):
            errors["config"] = "A built-in fine-tune needs config.dataset (a text file, one example a line)."
        if framework in (Framework.DEEPSPEED, Framework.TORCH_FSDP) and not gpus_per_worker:
            errors["gpus_per_worker"] = f"{Framework(framework).label} needs at least one GPU per worker."
        lora = config.get("lora")
        if lora is not None and (not isinstance(lora, dict) or not isinstance(lora.get("r"), int) or lora["r"] < 1):
            errors["config"] = "config.lora must be an object with a positive integer r (and lora_alpha, ...)."
    job = TrainingJob(
        workspace=workspace,
        ray_cluster=ray_cluster if isinstance(ray_cluster, RayCluster) else None,
        name=name.strip() if isinstance(name, str) else name,
        kind=kind,
        script=script or "",
        entrypoint=entrypoint or "",
        framework=framework,
        config=config,
        num_workers=num_workers,
        cpus_per_worker=cpus_per_worker,
        gpus_per_worker=gpus_per_worker,
        checkpoint_every=checkpoint_every,
        checkpoints_to_keep=checkpoints_to_keep,
        storage_path=storage_path or "",
        source_experiment=source_experiment,
        created_by=actor,
    )
    _full_clean(job, errors)
    _save_new(job)
    TrainingJob.objects.filter(pk=job.pk).update(submission_id=f"train-{job.pk}")
    job.submission_id = f"train-{job.pk}"
    _try_submit_training(job, actor)
    return job


def _try_submit_training(job: TrainingJob, actor: Any) -> bool:
    cluster = job.ray_cluster
    reason = _queue_reason(cluster, job.gpus_needed)
    if not reason and _submit(actor, cluster, render.training_submission(job)) is None:
        reason = f"Ray cluster {cluster.name} has no running head yet."
    fields: dict[str, Any] = {"queue_reason": reason}
    if not reason:
        fields["submitted_at"] = timezone.now()
    TrainingJob.objects.filter(pk=job.pk).update(**fields)
    for name, value in fields.items():
        setattr(job, name, value)
    return not reason


@operator_action("training_job.cancel", target=on("job", "training_job"))
def training_job_cancel(*, actor: AbstractBaseUser, job: TrainingJob) -> TrainingJob:
    """Cancel: a job not yet on Ray is cancelled at once; a submitted one is stopped through the Job API."""
    _require_operator(actor, job.workspace)
    job = TrainingJob.objects.select_for_update().select_related("ray_cluster").get(pk=job.pk)
    _cancel(job, actor)
    return job


def _cancel(row: TrainingJob | TuneExperiment, actor: Any) -> None:
    if row.status not in J.active():
        raise IllegalTransition(f"A {row.status} job cannot be cancelled.")
    if row.submitted_at is None:
        _job_transition(row, J.CANCELLED, cancel_requested=True)
        return
    type(row).objects.filter(pk=row.pk).update(cancel_requested=True)
    row.cancel_requested = True
    if _send(actor, row.ray_cluster, "ray.job.stop", submission_id=row.submission_id) is None:
        _job_transition(row, J.CANCELLED, failure_reason="Cancelled; the Ray cluster was not running.")


def _record_job_status(row: TrainingJob | TuneExperiment, data: dict[str, Any]) -> None:
    """Store a `ray.job.status` result on a training job / experiment and move its state."""
    ray_state = str(data.get("status", ""))
    fields: dict[str, Any] = {
        "last_status": {k: v for k, v in data.items() if k not in ("logs", "markers")},
        "last_status_at": timezone.now(),
        "logs": str(data.get("logs", ""))[-200_000:],
    }
    if data.get("traceback"):
        fields["traceback"] = str(data["traceback"])[-50_000:]
    markers = data.get("markers") if isinstance(data.get("markers"), list) else []
    if isinstance(row, TrainingJob):
        checkpoints = [
            {"path": str(m.get("path", "")), "metrics": m.get("metrics") or {}}
            for m in markers
            if m.get("kind") == "checkpoint" and m.get("path")
        ]
        if checkpoints:
            fields["checkpoints"] = checkpoints
    else:
        _record_trials(row, markers)
        best = next((m for m in reversed(markers) if m.get("kind") == "best"), None)
        if best is not None:
            fields["best_config"] = best.get("config") or {}
            fields["best_result"] = best.get("metrics") or {}
    if ray_state == "STOPPED":
        target = J.CANCELLED
    else:
        target = RAY_JOB_STATES.get(ray_state, row.status)
    if target == J.FAILED and not fields.get("failure_reason"):
        fields["failure_reason"] = str(data.get("message", ""))[:2000]
    if target == J.QUEUED and row.status == J.QUEUED and isinstance(row, TrainingJob):  # experiments have none
        fields["queue_reason"] = "Ray has the job pending: " + (str(data.get("message", "")) or "waiting for resources")
    if row.status in J.active() and target != row.status and target in JOB_TRANSITIONS[row.status]:
        _job_transition(row, target, **fields)
    else:
        type(row).objects.filter(pk=row.pk).update(**fields)
        for name, value in fields.items():
            setattr(row, name, value)


# --------------------------------------------------------------------------------------------------
# Tune experiments


@operator_action(
    "tune_experiment.create",
    target=new("tune_experiment"),
    result=created("tune_experiment"),
)
def tune_experiment_create(
    *,
    actor: AbstractBaseUser,
    workspace: Workspace,
    ray_cluster: RayCluster,
    name: str,
    search_space: dict[str, Any],
    metric: str = "score",
    mode: str = TuneMode.MAX,
    num_samples: int = 4,
    max_concurrent_trials: int = 2,
    max_iterations: int = 10,
    scheduler: str = TuneScheduler.FIFO,
    scheduler_config: dict[str, Any] | None = None,
    objective_code: str = "",
    cpus_per_trial: float = 1.0,
    gpus_per_trial: float = 0.0,
    training_script: str = "",
) -> TuneExperiment:
    """Create a Tune experiment (Owner/Admin) and submit it as a Ray job (or queue it)."""
    _require_operator(actor, workspace)
    errors: dict[str, Any] = {}
    _check_cluster(workspace, ray_cluster, errors)
    space_errors = render.search_space_errors(search_space)
    if space_errors:
        errors["search_space"] = space_errors
    if objective_code:
        try:
            compile(objective_code, "objective.py", "exec")
        except SyntaxError as exc:
            errors["objective_code"] = f"Python syntax error on line {exc.lineno}: {exc.msg}"
        else:
            if "def objective" not in objective_code:
                errors["objective_code"] = "Define objective(config, report)."
    if scheduler == TuneScheduler.PBT and not errors.get("search_space"):
        if all(spec.get("type") == "grid" for spec in search_space.values()):
            errors["scheduler"] = "PBT needs at least one non-grid parameter to mutate."
    if scheduler_config is not None and not isinstance(scheduler_config, dict):
        errors["scheduler_config"] = "An object."
    experiment = TuneExperiment(
        workspace=workspace,
        ray_cluster=ray_cluster if isinstance(ray_cluster, RayCluster) else None,
        name=name.strip() if isinstance(name, str) else name,
        search_space=search_space if isinstance(search_space, dict) else {},
        metric=metric,
        mode=mode,
        num_samples=num_samples,
        max_concurrent_trials=max_concurrent_trials,
        max_iterations=max_iterations,
        scheduler=scheduler,
        scheduler_config=scheduler_config if isinstance(scheduler_config, dict) else {},
        objective_code=objective_code or "",
        cpus_per_trial=cpus_per_trial,
        gpus_per_trial=gpus_per_trial,
        training_script=training_script or "",
        created_by=actor,
    )
    _full_clean(experiment, errors)
    _save_new(experiment)
    experiment.submission_id = f"tune-{experiment.pk}"
    TuneExperiment.objects.filter(pk=experiment.pk).update(submission_id=experiment.submission_id)
    _try_submit_tune(experiment, actor)
    return experiment


def _try_submit_tune(experiment: TuneExperiment, actor: Any) -> bool:
    cluster = experiment.ray_cluster
    reason = _queue_reason(cluster, experiment.gpus_per_trial)
    if not reason and _submit(actor, cluster, render.tune_submission(experiment)) is None:
        reason = f"Ray cluster {cluster.name} has no running head yet."
    if not reason:
        TuneExperiment.objects.filter(pk=experiment.pk).update(submitted_at=timezone.now())
        experiment.submitted_at = timezone.now()
    experiment.failure_reason = reason
    TuneExperiment.objects.filter(pk=experiment.pk).update(failure_reason=reason)
    return not reason


@operator_action("tune_experiment.cancel", target=on("experiment", "tune_experiment"))
def tune_experiment_cancel(*, actor: AbstractBaseUser, experiment: TuneExperiment) -> TuneExperiment:
    """Cancel a queued or running experiment (its Ray job is stopped)."""
    _require_operator(actor, experiment.workspace)
    experiment = TuneExperiment.objects.select_for_update().select_related("ray_cluster").get(pk=experiment.pk)
    _cancel(experiment, actor)
    return experiment


def _record_trials(experiment: TuneExperiment, markers: list[dict[str, Any]]) -> None:
    latest: dict[str, dict[str, Any]] = {}
    for marker in markers:
        if marker.get("kind") != "trial" or not marker.get("trial_id"):
            continue
        entry = latest.setdefault(str(marker["trial_id"])[:100], {"status": "PENDING", "config": {}})
        entry["status"] = str(marker.get("status", entry["status"]))[:16]
        entry["config"] = marker.get("config") or entry["config"]
        if "iteration" in marker:
            entry["iterations"] = int(marker.get("iteration") or 0)
            entry["metric_value"] = marker.get("metric")
            entry["last_result"] = marker.get("result") or {}
    for trial_id, entry in latest.items():
        TuneTrial.objects.update_or_create(experiment=experiment, trial_id=trial_id, defaults=entry)


@operator_action(
    "tune_experiment.train",
    target=on("experiment", "tune_experiment"),
    detail=lambda kw, job: {"training_job": str(job.pk)} if job else {"name": str(kw.get("name"))[:63]},
)
def tune_train_with_best(
    *, actor: AbstractBaseUser, experiment: TuneExperiment, name: str, storage_path: str = ""
) -> TrainingJob:
    """ "Train with best config": a training job running the experiment's training script with its best config."""
    _require_operator(actor, experiment.workspace)
    if not experiment.best_config:
        raise IllegalTransition("The experiment has no best config yet.")
    if not experiment.training_script.strip():
        raise ValidationError({"training_script": "The experiment has no training script to run."})
    return training_job_create(
        actor=actor,
        workspace=experiment.workspace,
        ray_cluster=experiment.ray_cluster,
        name=name,
        script=experiment.training_script,
        config=dict(experiment.best_config),
        cpus_per_worker=experiment.cpus_per_trial,
        gpus_per_worker=experiment.gpus_per_trial,
        storage_path=storage_path,
        source_experiment=experiment,
    )


# --------------------------------------------------------------------------------------------------
# Serve deployments


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
    """Deploy a model or a training job's checkpoint on Ray Serve (Owner/Admin)."""
    _require_operator(actor, workspace)
    errors: dict[str, Any] = {}
    _check_cluster(workspace, ray_cluster, errors)
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
    _full_clean(deployment, errors)
    neighbours = ServeDeployment.objects.filter(ray_cluster=ray_cluster, status__in=ServeStatus.live())
    if neighbours.filter(route_prefix=route).exists():
        raise ValidationError({"route_prefix": "Another deployment on this Ray cluster serves this route."})
    other_port = neighbours.exclude(http_port=http_port).values_list("http_port", flat=True).first()
    if other_port is not None:
        raise ValidationError({"http_port": f"Serve on this Ray cluster listens on port {other_port}; use it."})
    _save_new(deployment)
    _deploy(deployment, actor)
    return deployment


def _deploy(deployment: ServeDeployment, actor: Any) -> None:
    submission = render.serve_submission(deployment)
    command = _submit(actor, deployment.ray_cluster, submission)
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
    _require_operator(actor, deployment.workspace)
    deployment = ServeDeployment.objects.select_for_update().select_related("ray_cluster").get(pk=deployment.pk)
    if deployment.status in (ServeStatus.STOPPED, ServeStatus.STOPPING):
        raise IllegalTransition(f"A {deployment.status} deployment cannot be stopped.")
    attempt = Command.objects.filter(
        command_type="ray.job.submit", payload__submission_id__startswith=f"serve-{deployment.pk}-delete"
    ).count()
    submission = render.serve_submission(deployment, action="delete", attempt=attempt)
    command = None
    if deployment.status != ServeStatus.PENDING:
        command = _submit(actor, deployment.ray_cluster, submission)
    to = ServeStatus.STOPPING if command is not None else ServeStatus.STOPPED
    fields = {"status": to, "status_changed_at": timezone.now()}
    if command is not None:
        fields["submission_id"] = submission.submission_id
    ServeDeployment.objects.filter(pk=deployment.pk).update(**fields)
    deployment.refresh_from_db()
    return deployment


def _record_serve_job(deployment: ServeDeployment, data: dict[str, Any]) -> None:
    """A deploy/delete job's status: failures (with traceback) are shown; success hands over to Serve status."""
    state = str(data.get("status", ""))
    fields: dict[str, Any] = {"last_status_at": timezone.now()}
    if state == "FAILED" or state == "STOPPED":
        reason = str(data.get("traceback") or data.get("message") or "the deploy job failed")
        fields.update(status=ServeStatus.FAILED, failure_reason=reason[-20_000:])
    elif state == "SUCCEEDED" and deployment.status == ServeStatus.STOPPING:
        fields.update(status=ServeStatus.STOPPED, endpoint_url="")
    if "status" in fields:
        fields["status_changed_at"] = timezone.now()
    ServeDeployment.objects.filter(pk=deployment.pk).update(**fields)


def _record_serve_status(deployment: ServeDeployment, data: dict[str, Any]) -> None:
    apps = data.get("applications") if isinstance(data.get("applications"), dict) else {}
    app = apps.get(deployment.app_name)
    status, reason = health.serve_health(app, deploying=deployment.status == ServeStatus.DEPLOYING)
    fields: dict[str, Any] = {
        "last_status": {
            **{k: v for k, v in (app or {}).items() if k != "replica_logs"},
            "http_port": data.get("http_port"),
        },
        "last_status_at": timezone.now(),
    }
    if app:
        fields["replica_logs"] = app.get("replica_logs") or {}
    if deployment.status not in (ServeStatus.STOPPING, ServeStatus.STOPPED, ServeStatus.FAILED):
        fields["failure_reason"] = reason
        if status != deployment.status:
            fields.update(status=status, status_changed_at=timezone.now())
        port = data.get("http_port") or deployment.http_port
        cluster = deployment.ray_cluster
        if status in (ServeStatus.RUNNING, ServeStatus.DEGRADED) and cluster.head_ip:
            fields["endpoint_url"] = f"http://{cluster.head_ip}:{port}{deployment.route_prefix}"
    ServeDeployment.objects.filter(pk=deployment.pk).update(**fields)


# --------------------------------------------------------------------------------------------------
# Poll pass (Celery beat) and command results


def workloads_poll() -> int:
    """Beat: submit queued jobs that now fit, ask the heads for job and Serve status; returns commands sent."""
    sent = 0
    for model in (TrainingJob, TuneExperiment):
        rows = model.objects.filter(status__in=J.active()).select_related("ray_cluster", "workspace")
        for row in rows.order_by("created_at"):
            actor = ray_services._operator_for(row.ray_cluster)
            with transaction.atomic():
                if row.submitted_at is None:
                    submit = _try_submit_training if model is TrainingJob else _try_submit_tune
                    sent += int(submit(row, actor))
                elif not _in_flight("ray.job.submit", row.submission_id) and not _in_flight(
                    "ray.job.status", row.submission_id
                ):  # never ask about a job before the head has confirmed its submission
                    command = _send(
                        actor, row.ray_cluster, "ray.job.status", submission_id=row.submission_id, log_lines=LOG_LINES
                    )
                    sent += command is not None
    deployments = ServeDeployment.objects.filter(status__in=ServeStatus.live()).select_related("ray_cluster")
    for deployment in deployments.order_by("created_at"):
        actor = ray_services._operator_for(deployment.ray_cluster)
        with transaction.atomic():
            if deployment.status == ServeStatus.PENDING:
                _deploy(deployment, actor)
                sent += deployment.status == ServeStatus.DEPLOYING
                continue
            if _in_flight("ray.job.submit", deployment.submission_id):
                continue  # the deploy (or delete) job is not on the head yet
            busy = deployment.status in (ServeStatus.DEPLOYING, ServeStatus.STOPPING)
            if busy and not _in_flight("ray.job.status", deployment.submission_id):
                command = _send(actor, deployment.ray_cluster, "ray.job.status", submission_id=deployment.submission_id)
                sent += command is not None
            if deployment.status != ServeStatus.STOPPING and not _serve_status_in_flight(deployment):
                command = _send(actor, deployment.ray_cluster, "ray.serve.status", app_name=deployment.app_name)
                sent += command is not None
    return sent


def _serve_status_in_flight(deployment: ServeDeployment) -> bool:
    return Command.objects.filter(
        command_type="ray.serve.status", payload__app_name=deployment.app_name, status__in=IN_FLIGHT
    ).exists()


def workload_on_command_finished(*, command: Command) -> None:
    """Fleet `command_finished` hook: record workload command results on their rows."""
    if command.command_type not in WORKLOAD_COMMANDS or command.status not in CommandStatus.terminal():
        return
    ok = command.status == CommandStatus.SUCCEEDED
    payload = command.payload or {}
    data = command.result or {}
    submission_id = str(payload.get("submission_id", ""))
    with transaction.atomic():
        if command.command_type == "ray.serve.status":
            deployment = (
                ServeDeployment.objects.select_for_update()
                .select_related("ray_cluster")
                .filter(ray_cluster_id=payload.get("cluster_id"), name=str(payload.get("app_name", ""))[4:])
                .first()
            )
            if deployment is not None and ok:
                _record_serve_status(deployment, data)
            return
        row = _row_for(submission_id)
        if row is None:
            return
        if isinstance(row, ServeDeployment):
            if command.command_type == "ray.job.status" and ok and row.submission_id == submission_id:
                _record_serve_job(row, data)
            elif command.command_type == "ray.job.submit" and not ok:
                ServeDeployment.objects.filter(pk=row.pk).update(
                    status=ServeStatus.FAILED, status_changed_at=timezone.now(), failure_reason=_error(command)
                )
            return
        if command.command_type == "ray.job.submit" and not ok and row.status in J.active():
            _job_transition(row, J.FAILED, failure_reason=f"Submission to Ray failed: {_error(command)}")
        elif command.command_type == "ray.job.status" and ok:
            _record_job_status(row, data)
        elif (
            command.command_type == "ray.job.status" and command.error_code == "not_found" and row.status in J.active()
        ):
            _job_transition(row, J.FAILED, failure_reason=f"Ray no longer knows this job: {_error(command)}")


def _error(command: Command) -> str:
    return f"{command.error_code}: {command.error_message}" if command.error_code else command.error_message


def _row_for(submission_id: str) -> TrainingJob | TuneExperiment | ServeDeployment | None:
    prefix, _, rest = submission_id.partition("-")
    key = rest[:36]
    model: Any = {"train": TrainingJob, "tune": TuneExperiment, "serve": ServeDeployment}.get(prefix)
    if model is None:
        return None
    try:
        return model.objects.select_for_update().select_related("ray_cluster", "workspace").filter(pk=key).first()
    except ValidationError:
        return None

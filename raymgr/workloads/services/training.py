"""Training jobs: create (submit or queue), cancel."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser

from audit.services import created, new, on, operator_action
from raymgr.models import RayCluster
from raymgr.workloads.models import Framework, TrainingJob, TrainingKind, TuneExperiment
from raymgr.workloads.services.jobs import check_cluster, full_clean, job_cancel, save_new
from raymgr.workloads.services.queue import ray_queue_dispatch
from tenancy.mixins import require_editor
from tenancy.models import Workspace


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
    priority: int = 50,
    queue_timeout_s: int | None = None,
) -> TrainingJob:
    """Create a training job (Owner, Admin, Member) and submit it, or leave it queued with the reason why."""
    require_editor(actor, workspace, what="run Ray workloads")
    errors: dict[str, Any] = {}
    check_cluster(workspace, ray_cluster, errors)
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
        priority=priority,
        queue_timeout_s=queue_timeout_s,
        created_by=actor,
    )
    full_clean(job, errors)
    save_new(job)
    TrainingJob.objects.filter(pk=job.pk).update(submission_id=f"train-{job.pk}")
    job.submission_id = f"train-{job.pk}"
    ray_queue_dispatch(cluster_id=job.ray_cluster_id, actor=actor)  # it starts now, or waits its turn
    job.refresh_from_db(fields=["queue_reason", "submitted_at"])
    return job


@operator_action("training_job.cancel", target=on("job", "training_job"))
def training_job_cancel(*, actor: AbstractBaseUser, job: TrainingJob) -> TrainingJob:
    """Cancel: a job not yet on Ray is cancelled at once; a submitted one is stopped through the Job API."""
    require_editor(actor, job.workspace, what="run Ray workloads")
    job = TrainingJob.objects.select_for_update().select_related("ray_cluster").get(pk=job.pk)
    job_cancel(job, actor)
    return job

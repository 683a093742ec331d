"""Tune experiments: create (submit or queue), cancel, and "train with best config"."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError

from audit.services import created, new, on, operator_action
from kernel.exceptions import IllegalTransition
from raymgr.models import RayCluster
from raymgr.workloads import render
from raymgr.workloads.models import TrainingJob, TuneExperiment, TuneMode, TuneScheduler
from raymgr.workloads.services.jobs import check_cluster, full_clean, job_cancel, save_new
from raymgr.workloads.services.queue import ray_queue_dispatch
from raymgr.workloads.services.training import training_job_create
from tenancy.mixins import require_editor
from tenancy.models import Workspace


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
    priority: int = 50,
    queue_timeout_s: int | None = None,
) -> TuneExperiment:
    """Create a Tune experiment (Owner, Admin, Member) and submit it as a Ray job (or queue it)."""
    require_editor(actor, workspace, what="run Ray workloads")
    errors: dict[str, Any] = {}
    check_cluster(workspace, ray_cluster, errors)
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
        priority=priority,
        queue_timeout_s=queue_timeout_s,
        created_by=actor,
    )
    full_clean(experiment, errors)
    save_new(experiment)
    experiment.submission_id = f"tune-{experiment.pk}"
    TuneExperiment.objects.filter(pk=experiment.pk).update(submission_id=experiment.submission_id)
    ray_queue_dispatch(cluster_id=experiment.ray_cluster_id, actor=actor)  # it starts now, or waits its turn
    experiment.refresh_from_db(fields=["queue_reason", "submitted_at"])
    return experiment


@operator_action("tune_experiment.cancel", target=on("experiment", "tune_experiment"))
def tune_experiment_cancel(*, actor: AbstractBaseUser, experiment: TuneExperiment) -> TuneExperiment:
    """Cancel a queued or running experiment (its Ray job is stopped)."""
    require_editor(actor, experiment.workspace, what="run Ray workloads")
    experiment = TuneExperiment.objects.select_for_update().select_related("ray_cluster").get(pk=experiment.pk)
    job_cancel(experiment, actor)
    return experiment


@operator_action(
    "tune_experiment.train",
    target=on("experiment", "tune_experiment"),
    detail=lambda kw, job: {"training_job": str(job.pk)} if job else {"name": str(kw.get("name"))[:63]},
)
def tune_train_with_best(
    *, actor: AbstractBaseUser, experiment: TuneExperiment, name: str, storage_path: str = ""
) -> TrainingJob:
    """ "Train with best config": a training job running the experiment's training script with its best config."""
    require_editor(actor, experiment.workspace, what="run Ray workloads")
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

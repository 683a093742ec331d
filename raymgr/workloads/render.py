"""Turn workload rows into Ray job submissions (entrypoint, working-dir files, runtime_env); pure functions."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from raymgr.workloads import scripts
from raymgr.workloads.models import Framework, ServeDeployment, TrainingJob, TrainingKind, TuneExperiment

SEARCH_TYPES = ("uniform", "loguniform", "randint", "choice", "grid", "constant")


@dataclass(frozen=True)
class Submission:
    """What `ray.job.submit` carries for one workload."""

    submission_id: str
    entrypoint: str
    files: dict[str, str]
    runtime_env: dict[str, Any] = field(default_factory=dict)
    entrypoint_num_cpus: float = 0.0
    entrypoint_num_gpus: float = 0.0

    @property
    def spec(self) -> dict[str, Any]:
        """The ctfleet_spec.json the job reads."""
        return json.loads(self.files["ctfleet_spec.json"])


def _spec_file(spec: dict[str, Any]) -> str:
    return json.dumps(spec, indent=2, sort_keys=True, default=str)


def training_submission(job: TrainingJob) -> Submission:
    """A training job as a Ray job: the user's train.py, or the built-in fine-tune (TorchTrainer)."""
    spec = {
        "job": job.submission_id or f"train-{job.pk}",
        "name": job.name,
        "config": job.config,
        "storage_path": job.storage_path,
        "framework": job.framework,
        "scaling": {
            "num_workers": job.num_workers,
            "cpus_per_worker": job.cpus_per_worker,
            "gpus_per_worker": job.gpus_per_worker,
        },
        "checkpoint_every": job.checkpoint_every,
        "checkpoints_to_keep": job.checkpoints_to_keep,
    }
    files = {"ctfleet.py": scripts.HELPER, "ctfleet_spec.json": _spec_file(spec)}
    if job.kind == TrainingKind.FINETUNE:
        config = dict(job.config)
        config.setdefault("checkpoint_every", job.checkpoint_every)
        if job.framework == Framework.DEEPSPEED:
            config.setdefault("deepspeed_config", deepspeed_config(job))
        spec["config"] = config
        files["ctfleet_spec.json"] = _spec_file(spec)
        files["finetune.py"] = scripts.FINETUNE
        entrypoint = "python finetune.py"
        runtime_env: dict[str, Any] = {"pip": finetune_requirements(job)} if job.config.get("pip") else {}
    else:
        files["train.py"] = job.script
        entrypoint = job.entrypoint or "python train.py"
        # A plain script runs in the job's driver: reserve what one worker asks for there.
        runtime_env = {}
    return Submission(
        submission_id=spec["job"],
        entrypoint=entrypoint,
        files=files,
        runtime_env=runtime_env,
        entrypoint_num_cpus=job.cpus_per_worker if job.kind == TrainingKind.SCRIPT else 0.0,
        entrypoint_num_gpus=job.gpus_per_worker if job.kind == TrainingKind.SCRIPT else 0.0,
    )


def deepspeed_config(job: TrainingJob) -> dict[str, Any]:
    """A ZeRO config for the built-in fine-tune (stage from config['zero_stage'], default 2)."""
    return {
        "train_micro_batch_size_per_gpu": int(job.config.get("batch_size", 1)),
        "zero_optimization": {"stage": int(job.config.get("zero_stage", 2))},
        "bf16": {"enabled": bool(job.config.get("bf16", True))},
    }


def finetune_requirements(job: TrainingJob) -> list[str]:
    """Pip packages the built-in fine-tune needs on the cluster (when config['pip'] asks to install them)."""
    packages = ["torch", "transformers"]
    if job.config.get("lora"):
        packages.append("peft")
    if job.framework == Framework.DEEPSPEED:
        packages.append("deepspeed")
    return packages


def tune_submission(experiment: TuneExperiment) -> Submission:
    """A Tune experiment as a Ray job running scripts.TUNE."""
    spec = {
        "job": experiment.submission_id or f"tune-{experiment.pk}",
        "name": experiment.name,
        "search_space": experiment.search_space,
        "metric": experiment.metric,
        "mode": experiment.mode,
        "num_samples": experiment.num_samples,
        "max_concurrent_trials": experiment.max_concurrent_trials,
        "max_iterations": experiment.max_iterations,
        "scheduler": experiment.scheduler,
        "scheduler_config": experiment.scheduler_config,
        "objective_code": experiment.objective_code,
        "cpus_per_trial": experiment.cpus_per_trial,
        "gpus_per_trial": experiment.gpus_per_trial,
        "storage_path": "",
    }
    return Submission(
        submission_id=spec["job"],
        entrypoint="python tune_run.py",
        files={"tune_run.py": scripts.TUNE, "ctfleet.py": scripts.HELPER, "ctfleet_spec.json": _spec_file(spec)},
    )


def serve_submission(deployment: ServeDeployment, *, action: str = "deploy", attempt: int = 0) -> Submission:
    """Deploying (or deleting) a Serve application as a short Ray job running scripts.SERVE."""
    autoscaling_config = {
        "min_replicas": deployment.min_replicas,
        "max_replicas": deployment.max_replicas,
        "target_ongoing_requests": deployment.target_ongoing_requests,
    }
    deployment_config = (
        {"autoscaling_config": autoscaling_config}
        if deployment.autoscaling
        else {"num_replicas": deployment.num_replicas}
    )
    checkpoint = deployment.checkpoint_path or (
        deployment.checkpoint_job.latest_checkpoint if deployment.checkpoint_job_id else ""
    )
    spec = {
        "action": action,
        "name": deployment.name,
        "app_name": deployment.app_name,
        "engine": deployment.engine,
        "model": deployment.model,
        "checkpoint_path": checkpoint,
        "code": deployment.code,
        "route_prefix": deployment.route_prefix,
        "http_host": "0.0.0.0",
        "http_port": deployment.http_port,
        "num_replicas": deployment.num_replicas,
        "autoscaling": deployment.autoscaling,
        "autoscaling_config": autoscaling_config,
        "deployment_config": deployment_config,
        "cpus_per_replica": deployment.cpus_per_replica,
        "gpus_per_replica": deployment.gpus_per_replica,
    }
    suffix = f"-{action}-{attempt}" if action != "deploy" or attempt else ""
    return Submission(
        submission_id=f"serve-{deployment.pk}{suffix}",
        entrypoint="python serve_deploy.py",
        files={"serve_deploy.py": scripts.SERVE, "ctfleet.py": scripts.HELPER, "ctfleet_spec.json": _spec_file(spec)},
    )


def search_space_errors(space: Any) -> list[str]:
    """What is wrong with a Tune search space (empty list when it is fine)."""
    if not isinstance(space, dict) or not space:
        return ["A non-empty object of parameter → {type, ...}."]
    errors = []
    for name, spec in space.items():
        if not isinstance(spec, dict) or spec.get("type") not in SEARCH_TYPES:
            errors.append(f"{name}: type must be one of {', '.join(SEARCH_TYPES)}.")
            continue
        kind = spec["type"]
        if kind in ("uniform", "loguniform", "randint"):
            low, high = spec.get("lower"), spec.get("upper")
            if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (low, high)):
                errors.append(f"{name}: lower and upper must be numbers.")
            elif low >= high:
                errors.append(f"{name}: lower must be below upper.")
            elif kind == "loguniform" and low <= 0:
                errors.append(f"{name}: loguniform bounds must be positive.")
        elif kind in ("choice", "grid"):
            if not isinstance(spec.get("values"), list) or not spec["values"]:
                errors.append(f"{name}: values must be a non-empty list.")
        elif "value" not in spec:
            errors.append(f"{name}: a constant needs a value.")
    return errors

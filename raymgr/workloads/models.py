"""Ray workloads on managed Ray clusters: training jobs, Serve deployments, Tune experiments and trials.

Imported (not re-exported) at the end of `raymgr.models` so Django registers them with the raymgr app.
Status fields are written only through `raymgr.workloads.services` transition functions.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from fleet import origin_names
from tenancy.models import Workspace

NAME_VALIDATOR = RegexValidator(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "Use lower-case letters, digits and hyphens (a DNS label)."
)


class JobStatus(models.TextChoices):
    """Lifecycle of a training job or Tune experiment (a Ray job on the head)."""

    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"

    @classmethod
    def active(cls) -> tuple[str, ...]:
        """Not finished yet."""
        return (cls.QUEUED, cls.RUNNING)

    @classmethod
    def sentence(cls, status: str, *, queue_reason: str = "", failure_reason: str = "") -> str:
        """The one sentence every page and the API show under a job's status badge, for that status only: a
        finished job never reads as queued, whatever reason it waited for once."""
        if status == cls.QUEUED:
            return f"Queued: {queue_reason}" if queue_reason else "Queued: waiting to be submitted to Ray."
        if status == cls.RUNNING:
            return "Running on the Ray cluster."
        if status == cls.SUCCEEDED:
            return "Succeeded: the Ray job finished without error."
        if status == cls.FAILED:
            return f"Failed: {failure_reason}" if failure_reason else "Failed."
        if status == cls.CANCELLED:
            return failure_reason or "Cancelled."
        return ""


class TrainingKind(models.TextChoices):
    """A user's script, or the built-in fine-tune rendered from a framework config."""

    SCRIPT = "script", "Training script"
    FINETUNE = "finetune", "Built-in fine-tune"


class Framework(models.TextChoices):
    """Distributed training framework of a built-in fine-tune (Ray Train TorchTrainer)."""

    NONE = "none", "None (plain script)"
    TORCH_DDP = "torch_ddp", "PyTorch DDP"
    TORCH_FSDP = "torch_fsdp", "PyTorch FSDP"
    DEEPSPEED = "deepspeed", "DeepSpeed"


PRIORITY_VALIDATORS = [MinValueValidator(0), MaxValueValidator(100)]


class _QueuedJob(models.Model):
    """What the Ray job queue (`raymgr.workloads.queue`) reads of a training job or Tune experiment: its
    priority (0-100, higher first; FIFO within one), how long it may wait, and why it waits now."""

    priority = models.PositiveSmallIntegerField(
        default=50, validators=PRIORITY_VALIDATORS, help_text="0-100; higher starts first, FIFO within a priority."
    )
    queue_timeout_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Fail the job if it waits in the queue longer than this many seconds (empty: no limit).",
    )
    queue_reason = models.TextField(blank=True, default="")

    class Meta:
        abstract = True


class _Workload(models.Model):
    """Fields shared by every Ray workload."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=63, validators=[NAME_VALIDATOR])
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    status_changed_at = models.DateTimeField(auto_now_add=True)
    failure_reason = models.TextField(blank=True, default="")
    # The latest status result from the head and when it came.
    last_status = models.JSONField(default=dict, blank=True)
    last_status_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return self.name


class TrainingJob(_QueuedJob, _Workload):
    """A training job submitted to a Ray cluster's Job API; its logs, traceback and checkpoints."""

    ray_cluster = models.ForeignKey("raymgr.RayCluster", on_delete=models.CASCADE, related_name="training_jobs")
    kind = models.CharField(max_length=16, choices=TrainingKind.choices, default=TrainingKind.SCRIPT)
    script = models.TextField(blank=True, default="", help_text="Python source run as train.py (script jobs).")
    entrypoint = models.CharField(max_length=2000, blank=True, default="")
    framework = models.CharField(max_length=16, choices=Framework.choices, default=Framework.NONE)
    config = models.JSONField(default=dict, blank=True, help_text="Hyperparameters, model, LoRA options.")
    num_workers = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1), MaxValueValidator(512)])
    cpus_per_worker = models.FloatField(default=1.0, validators=[MinValueValidator(0), MaxValueValidator(1024)])
    gpus_per_worker = models.FloatField(default=0.0, validators=[MinValueValidator(0), MaxValueValidator(64)])
    checkpoint_every = models.PositiveIntegerField(default=1, help_text="Checkpoint every N epochs (0 = only at end).")
    checkpoints_to_keep = models.PositiveIntegerField(default=2, validators=[MinValueValidator(1)])
    storage_path = models.CharField(max_length=1000, blank=True, default="")
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED)
    submission_id = models.CharField(max_length=100, blank=True, default="")
    submitted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    logs = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    checkpoints = models.JSONField(default=list, blank=True, help_text="[{path, metrics}], newest last.")
    source_experiment = models.ForeignKey(
        "raymgr.TuneExperiment", null=True, blank=True, on_delete=models.SET_NULL, related_name="training_jobs"
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="trainingjob_unique_ws_name")]
        indexes = [models.Index(fields=["status"], name="trainingjob_status")]

    @property
    def status_sentence(self) -> str:
        """What the job's status means now (`JobStatus.sentence`)."""
        return JobStatus.sentence(self.status, queue_reason=self.queue_reason, failure_reason=self.failure_reason)

    @property
    def gpus_needed(self) -> float:
        """GPUs the whole job asks for."""
        return self.num_workers * self.gpus_per_worker

    @property
    def cpus_needed(self) -> float:
        """CPUs the whole job asks for."""
        return self.num_workers * self.cpus_per_worker

    @property
    def latest_checkpoint(self) -> str:
        """Path of the newest recorded checkpoint, or ''."""
        return str(self.checkpoints[-1].get("path", "")) if self.checkpoints else ""


class ServeEngine(models.TextChoices):
    """What runs a Serve deployment: vLLM's LLM app, or a generic Python deployment."""

    PYTHON = "python", "Generic Python"
    VLLM = "vllm", "vLLM (LLM config)"


class ServeStatus(models.TextChoices):
    """Lifecycle of a Serve deployment as the control plane sees it."""

    PENDING = "pending", "Pending"
    DEPLOYING = "deploying", "Deploying"
    RUNNING = "running", "Running"
    DEGRADED = "degraded", "Degraded"
    UNHEALTHY = "unhealthy", "Unhealthy"
    FAILED = "failed", "Failed"
    STOPPING = "stopping", "Stopping"
    STOPPED = "stopped", "Stopped"

    @classmethod
    def live(cls) -> tuple[str, ...]:
        """States whose status is polled."""
        return (cls.PENDING, cls.DEPLOYING, cls.RUNNING, cls.DEGRADED, cls.UNHEALTHY, cls.STOPPING)


class ServeDeployment(_Workload):
    """A Ray Serve application (one deployment) of a model or a training job's checkpoint."""

    ray_cluster = models.ForeignKey("raymgr.RayCluster", on_delete=models.CASCADE, related_name="serve_deployments")
    engine = models.CharField(max_length=16, choices=ServeEngine.choices, default=ServeEngine.PYTHON)
    model = models.CharField(max_length=300, blank=True, default="", help_text="Model id or path (vLLM).")
    checkpoint_job = models.ForeignKey(
        TrainingJob, null=True, blank=True, on_delete=models.SET_NULL, related_name="serve_deployments"
    )
    checkpoint_path = models.CharField(max_length=1000, blank=True, default="")
    code = models.TextField(blank=True, default="", help_text="Optional load(path) / predict(payload, model).")
    route_prefix = models.CharField(max_length=200, default="/")
    http_port = models.PositiveIntegerField(default=8000, validators=[MinValueValidator(1), MaxValueValidator(65535)])
    num_replicas = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1), MaxValueValidator(256)])
    autoscaling = models.BooleanField(default=False)
    min_replicas = models.PositiveIntegerField(default=1, validators=[MaxValueValidator(256)])
    max_replicas = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1), MaxValueValidator(256)])
    target_ongoing_requests = models.FloatField(default=2.0, validators=[MinValueValidator(0.1)])
    cpus_per_replica = models.FloatField(default=1.0, validators=[MinValueValidator(0), MaxValueValidator(1024)])
    gpus_per_replica = models.FloatField(default=0.0, validators=[MinValueValidator(0), MaxValueValidator(64)])
    status = models.CharField(max_length=16, choices=ServeStatus.choices, default=ServeStatus.PENDING)
    submission_id = models.CharField(max_length=100, blank=True, default="")
    endpoint_url = models.CharField(max_length=500, blank=True, default="")
    replica_logs = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="servedeployment_unique_ws_name")]

    @property
    def proxy_path(self) -> str:
        """The control plane's path for the endpoint: it redirects to the deployment's own origin."""
        return f"/ray/serving/{self.pk}/endpoint/"

    @property
    def url(self) -> str:
        """The endpoint through the tunnel proxy, on its own origin `serve-<id>.<ENDPOINT_DOMAIN>`."""
        return origin_names.public_url(origin_names.SERVE.host(self.pk))

    @property
    def app_name(self) -> str:
        """The Serve application name on the cluster."""
        return f"app-{self.name}"


class TuneScheduler(models.TextChoices):
    """Trial schedulers offered."""

    FIFO = "fifo", "FIFO (none)"
    ASHA = "asha", "ASHA"
    PBT = "pbt", "Population Based Training"


class TuneMode(models.TextChoices):
    """Whether the metric is minimised or maximised."""

    MIN = "min", "Minimise"
    MAX = "max", "Maximise"


class TuneExperiment(_QueuedJob, _Workload):
    """A Ray Tune experiment run as a Ray job; its trials and best config."""

    ray_cluster = models.ForeignKey("raymgr.RayCluster", on_delete=models.CASCADE, related_name="tune_experiments")
    search_space = models.JSONField(default=dict, help_text='{"lr": {"type": "loguniform", "lower": 1e-4, ...}}')
    metric = models.CharField(max_length=100, default="score")
    mode = models.CharField(max_length=3, choices=TuneMode.choices, default=TuneMode.MAX)
    num_samples = models.PositiveIntegerField(default=4, validators=[MinValueValidator(1), MaxValueValidator(1000)])
    max_concurrent_trials = models.PositiveIntegerField(
        default=2, validators=[MinValueValidator(1), MaxValueValidator(256)]
    )
    max_iterations = models.PositiveIntegerField(default=10, validators=[MinValueValidator(1)])
    scheduler = models.CharField(max_length=8, choices=TuneScheduler.choices, default=TuneScheduler.FIFO)
    scheduler_config = models.JSONField(default=dict, blank=True)
    objective_code = models.TextField(
        blank=True, default="", help_text="def objective(config, report): ... (default: a built-in test objective)"
    )
    cpus_per_trial = models.FloatField(default=1.0, validators=[MinValueValidator(0), MaxValueValidator(1024)])
    gpus_per_trial = models.FloatField(default=0.0, validators=[MinValueValidator(0), MaxValueValidator(64)])
    training_script = models.TextField(blank=True, default="", help_text="Script for 'Train with best config'.")
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED)
    submission_id = models.CharField(max_length=100, blank=True, default="")
    submitted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    logs = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    best_config = models.JSONField(default=dict, blank=True)
    best_result = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="tuneexperiment_unique_ws_name")]

    @property
    def gpus_needed(self) -> float:
        """GPUs the experiment's concurrent trials ask for."""
        return self.max_concurrent_trials * self.gpus_per_trial

    @property
    def cpus_needed(self) -> float:
        """CPUs the experiment's concurrent trials ask for."""
        return self.max_concurrent_trials * self.cpus_per_trial

    @property
    def status_sentence(self) -> str:
        """What the experiment's status means now (`JobStatus.sentence`)."""
        return JobStatus.sentence(self.status, queue_reason=self.queue_reason, failure_reason=self.failure_reason)


class TuneTrial(models.Model):
    """One trial of a Tune experiment: its config, progress and latest result."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    experiment = models.ForeignKey(TuneExperiment, on_delete=models.CASCADE, related_name="trials")
    trial_id = models.CharField(max_length=100)
    status = models.CharField(max_length=16, default="PENDING")
    config = models.JSONField(default=dict, blank=True)
    iterations = models.PositiveIntegerField(default=0)
    metric_value = models.FloatField(null=True, blank=True)
    last_result = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["experiment", "trial_id"]
        constraints = [models.UniqueConstraint(fields=["experiment", "trial_id"], name="tunetrial_unique")]

    def __str__(self) -> str:
        return f"{self.trial_id} ({self.status})"

"""Page forms for Ray workloads (they parse input; services validate and decide)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.db.models import Case, Value, When

from raymgr.models import RayCluster, RayClusterStatus
from raymgr.workloads.models import Framework, ServeEngine, TrainingJob, TrainingKind, TuneMode, TuneScheduler
from tenancy.models import Role
from tenancy.selectors import workspace_ids

# The Ray cluster choices: running ones first, failed ones last.
CLUSTER_ORDER = (
    RayClusterStatus.RUNNING,
    RayClusterStatus.PENDING,
    RayClusterStatus.STOPPED,
    RayClusterStatus.DELETING,
    RayClusterStatus.FAILED,
)


def _cluster_label(cluster: RayCluster) -> str:
    """'name (workspace, status)'; a failed cluster says so plainly."""
    if cluster.status == RayClusterStatus.FAILED:
        return f"{cluster.name} ({cluster.workspace.name}, failed: start it again first)"
    return f"{cluster.name} ({cluster.workspace.name}, {cluster.status})"


# The training script box: an example (its placeholder) and what the script can count on.
SCRIPT_EXAMPLE = """import ctfleet  # next to train.py: hyperparameters, progress, checkpoints

config = ctfleet.config()  # the job's Config (a Tune experiment's best config)
lr = config.get("lr", 0.001)
for epoch in range(3):
    loss = 1.0 / (epoch + 1)  # your training step
    ctfleet.report(epoch=epoch, loss=loss)

path = ctfleet.checkpoint_dir()  # save your model's files here
ctfleet.report_checkpoint(path, loss=loss)  # selectable in Model Serving
"""
SCRIPT_HELP = (
    "For a Training script job: Python run on the Ray cluster as train.py (python train.py; Ray is "
    "installed, ray.init() joins the cluster). ctfleet.config() gives the Config, ctfleet.report() records "
    "progress, ctfleet.report_checkpoint() registers a checkpoint you can deploy from Model Serving. If the job "
    "fails at once, its page shows the Python traceback."
)


class _OnCluster(forms.Form):
    """A workload runs on one Ray cluster of a workspace the user operates; the cluster decides the workspace.

    A running cluster is preselected (none when none runs); running clusters come first, failed ones last.
    """

    name = forms.CharField(max_length=63, help_text="Unique in the workspace; lower-case letters, digits, hyphens.")
    ray_cluster = forms.ModelChoiceField(
        queryset=RayCluster.objects.none(),
        empty_label="— choose a Ray cluster —",
        help_text="Running clusters first. On one that is not running, the workload waits (queued) until it runs.",
    )

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        operated = workspace_ids(user=user, roles=Role.editors())  # Owners, Admins, Members
        rank = Case(
            *(When(status=s, then=Value(i)) for i, s in enumerate(CLUSTER_ORDER)), default=Value(len(CLUSTER_ORDER))
        )
        field = self.fields["ray_cluster"]
        field.queryset = (
            RayCluster.objects.filter(workspace_id__in=operated)
            .select_related("workspace")
            .order_by(rank, "name", "pk")
        )
        field.label_from_instance = _cluster_label
        if not self.initial.get("ray_cluster"):
            running = field.queryset.filter(status=RayClusterStatus.RUNNING).values_list("pk", flat=True).first()
            if running is not None:
                self.initial["ray_cluster"] = running


class _Queued(_OnCluster):
    """Where the job stands in its Ray cluster's queue while the cluster lacks room for it."""

    priority = forms.IntegerField(
        min_value=0,
        max_value=100,
        initial=50,
        required=False,
        help_text="0-100: higher starts first; first come first within one.",
    )
    queue_timeout_s = forms.IntegerField(
        min_value=1, required=False, label="Queue timeout (s)", help_text="Fail if still queued after this long."
    )


class TrainingJobForm(_Queued):
    """Ray → Training → New."""

    kind = forms.ChoiceField(choices=TrainingKind.choices)
    script = forms.CharField(
        widget=forms.Textarea(
            attrs={"rows": 12, "placeholder": SCRIPT_EXAMPLE, "spellcheck": "false", "class": "code"}
        ),
        required=False,
        strip=False,
        help_text=SCRIPT_HELP,
    )
    framework = forms.ChoiceField(choices=Framework.choices, initial=Framework.NONE)
    config = forms.JSONField(
        required=False, initial=dict, help_text='e.g. {"model": ..., "dataset": ..., "lora": {"r": 8}}'
    )
    num_workers = forms.IntegerField(min_value=1, max_value=512, initial=1)
    cpus_per_worker = forms.FloatField(min_value=0, initial=1.0)
    gpus_per_worker = forms.FloatField(min_value=0, initial=0.0)
    checkpoint_every = forms.IntegerField(min_value=0, initial=1, help_text="Epochs between checkpoints.")
    checkpoints_to_keep = forms.IntegerField(min_value=1, initial=2)
    storage_path = forms.CharField(required=False, max_length=1000, help_text="Where checkpoints go (shared storage).")


class TuneExperimentForm(_Queued):
    """Ray → Tune → New."""

    search_space = forms.JSONField(initial={"x": {"type": "uniform", "lower": 0, "upper": 5}})
    metric = forms.CharField(max_length=100, initial="score")
    mode = forms.ChoiceField(choices=TuneMode.choices, initial=TuneMode.MAX)
    num_samples = forms.IntegerField(min_value=1, initial=4)
    max_concurrent_trials = forms.IntegerField(min_value=1, initial=2)
    max_iterations = forms.IntegerField(min_value=1, initial=10)
    scheduler = forms.ChoiceField(choices=TuneScheduler.choices)
    scheduler_config = forms.JSONField(required=False, initial=dict)
    objective_code = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 8}), required=False, strip=False, help_text="def objective(config, report)"
    )
    cpus_per_trial = forms.FloatField(min_value=0, initial=1.0)
    gpus_per_trial = forms.FloatField(min_value=0, initial=0.0)
    training_script = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 8, "placeholder": SCRIPT_EXAMPLE, "spellcheck": "false", "class": "code"}),
        required=False,
        strip=False,
        help_text="For 'Train with best config': a training script (as on Ray → Training) that reads the best "
        "config with ctfleet.config().",
    )


class ServeDeploymentForm(_OnCluster):
    """Ray → Model Serving → New."""

    engine = forms.ChoiceField(choices=ServeEngine.choices)
    model = forms.CharField(max_length=300, required=False)
    checkpoint_job = forms.ModelChoiceField(queryset=TrainingJob.objects.none(), required=False)
    code = forms.CharField(widget=forms.Textarea(attrs={"rows": 8}), required=False, strip=False)
    route_prefix = forms.CharField(max_length=200, required=False, help_text="Default /<name>.")
    http_port = forms.IntegerField(min_value=1, max_value=65535, initial=8000)
    num_replicas = forms.IntegerField(min_value=1, initial=1)
    autoscaling = forms.BooleanField(required=False)
    min_replicas = forms.IntegerField(min_value=0, initial=1)
    max_replicas = forms.IntegerField(min_value=1, initial=1)
    target_ongoing_requests = forms.FloatField(min_value=0.1, initial=2.0)
    cpus_per_replica = forms.FloatField(min_value=0, initial=1.0)
    gpus_per_replica = forms.FloatField(min_value=0, initial=0.0)

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, user=user, **kwargs)
        operated = workspace_ids(user=user, roles=Role.editors())  # Owners, Admins, Members
        self.fields["checkpoint_job"].queryset = TrainingJob.objects.filter(workspace_id__in=operated).exclude(
            checkpoints=[]
        )

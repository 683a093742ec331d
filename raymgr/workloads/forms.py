"""Page forms for Ray workloads (they parse input; services validate and decide)."""

from __future__ import annotations

from typing import Any

from django import forms

from cleverthis.tenancy.models import Role
from cleverthis.tenancy.selectors import workspace_ids
from raymgr.models import RayCluster
from raymgr.workloads.models import Framework, ServeEngine, TrainingJob, TrainingKind, TuneMode, TuneScheduler


class _OnCluster(forms.Form):
    """A workload runs on one Ray cluster of a workspace the user operates; the cluster decides the workspace."""

    name = forms.CharField(max_length=63, help_text="Unique in the workspace; lower-case letters, digits, hyphens.")
    ray_cluster = forms.ModelChoiceField(queryset=RayCluster.objects.none(), empty_label=None)

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        operated = workspace_ids(user=user, roles=Role.operators())
        self.fields["ray_cluster"].queryset = (
            RayCluster.objects.filter(workspace_id__in=operated).select_related("workspace").order_by("name")
        )
        self.fields["ray_cluster"].label_from_instance = lambda c: f"{c.name} ({c.workspace.name}, {c.status})"


class TrainingJobForm(_OnCluster):
    """Ray → Training → New."""

    kind = forms.ChoiceField(choices=TrainingKind.choices)
    script = forms.CharField(widget=forms.Textarea(attrs={"rows": 12}), required=False, strip=False)
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


class TuneExperimentForm(_OnCluster):
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
        widget=forms.Textarea(attrs={"rows": 8}), required=False, strip=False, help_text="For 'Train with best config'."
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
        operated = workspace_ids(user=user, roles=Role.operators())
        self.fields["checkpoint_job"].queryset = TrainingJob.objects.filter(workspace_id__in=operated).exclude(
            checkpoints=[]
        )

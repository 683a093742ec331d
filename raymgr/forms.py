"""Page forms for managed Ray (they parse input; services validate and decide)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.db.models import Count, Q

from fleet.models import ComputeCluster, NodeStatus
from raymgr.models import RayRuntime, default_ray_version
from tenancy.models import Role
from tenancy.selectors import workspace_ids


class _ComputeClusterSelect(forms.Select):
    """A select whose compute clusters without an online node are disabled, saying why in their label."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.without_nodes: set[str] = set()

    def create_option(self, name: str, value: Any, label: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        option = super().create_option(name, value, label, *args, **kwargs)
        if str(value) in self.without_nodes:
            option["attrs"]["disabled"] = True
            option["label"] = f"{label} — no online nodes"
        return option


class RayClusterCreateForm(forms.Form):
    """Ray → Clusters → New: the compute cluster decides the workspace."""

    name = forms.CharField(max_length=63, help_text="Unique in the workspace; lower-case letters, digits, hyphens.")
    compute_cluster = forms.ModelChoiceField(
        queryset=ComputeCluster.objects.none(),
        empty_label="Choose a compute cluster",
        label="Compute Cluster",
        widget=_ComputeClusterSelect,
        help_text="Clusters without an online node are disabled: the head node needs one to start.",
    )
    ray_version = forms.ChoiceField(
        label="Ray Version",
        help_text="Installed on the head and worker containers. The process runtime runs the agent's own Ray.",
    )
    runtime = forms.ChoiceField(
        choices=RayRuntime.choices,
        initial=RayRuntime.DOCKER,
        help_text="Kubernetes and ArgoCD compute clusters always run a KubeRay RayCluster.",
    )
    min_workers = forms.IntegerField(label="Min Workers", min_value=0, max_value=1000, initial=0)
    max_workers = forms.IntegerField(
        label="Max Workers",
        min_value=0,
        max_value=1000,
        initial=10,
        help_text="At most the compute cluster's nodes minus one.",
    )
    idle_timeout_s = forms.IntegerField(min_value=1, max_value=86400, initial=60, label="Idle timeout (s)")
    worker_cpus = forms.FloatField(
        required=False,
        min_value=0.1,
        max_value=1024,
        initial=1.0,
        label="Worker CPUs",
        help_text="KubeRay: CPUs per worker pod.",
    )
    worker_memory_mb = forms.IntegerField(
        required=False,
        min_value=256,
        max_value=4 * 1024 * 1024,
        initial=2048,
        label="Worker memory (MB)",
        help_text="KubeRay: memory per worker pod.",
    )
    worker_gpus = forms.IntegerField(
        required=False,
        min_value=0,
        max_value=64,
        initial=0,
        label="Worker GPUs",
        help_text="KubeRay: GPUs per worker pod.",
    )
    checkpoint_on_stop = forms.BooleanField(required=False, label="Checkpoint jobs before stopping")
    serves_vllm = forms.BooleanField(
        required=False,
        label="Serve vLLM",
        help_text="Docker runtime: its containers run the Ray image carrying vLLM, for distributed endpoints.",
    )
    gcs_port = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=65535,
        label="GCS port",
        help_text="Leave empty: the head's node picks a free port at each start.",
    )
    dashboard_port = forms.IntegerField(min_value=1, max_value=65535, initial=8265)

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        versions = list(dict.fromkeys([*settings.RAY_VERSIONS, settings.RAY_PROCESS_VERSION]))
        self.fields["ray_version"].choices = [(v, v) for v in versions]
        self.fields["ray_version"].initial = default_ray_version()
        operated = workspace_ids(user=user, roles=Role.operators())
        field = self.fields["compute_cluster"]
        field.queryset = (
            ComputeCluster.objects.filter(workspace_id__in=operated)
            .select_related("workspace")
            .annotate(online_nodes=Count("nodes", filter=Q(nodes__status=NodeStatus.ONLINE)))
            .order_by("name")
        )
        field.label_from_instance = lambda c: f"{c.name} ({c.workspace.name})"
        if self.is_bound:
            return
        choices = list(field.queryset)
        field.widget.without_nodes = {str(c.pk) for c in choices if not c.online_nodes}
        busiest = max(choices, key=lambda c: c.online_nodes, default=None)
        if busiest is not None and busiest.online_nodes:
            field.initial = busiest.pk  # the most online nodes; never a cluster with none

    def clean_compute_cluster(self) -> ComputeCluster:
        cluster = self.cleaned_data["compute_cluster"]
        if not cluster.online_nodes:
            raise forms.ValidationError(
                f"{cluster.name} has no online nodes: the Ray head needs one. Join a node under Settings → Compute."
            )
        return cluster

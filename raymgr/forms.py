"""Page forms for managed Ray (they parse input; services validate and decide)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings

from cleverthis.tenancy.models import Role
from cleverthis.tenancy.selectors import workspace_ids
from fleet.models import ComputeCluster
from raymgr.models import RayRuntime, default_ray_version


class RayClusterCreateForm(forms.Form):
    """Ray → Clusters → New: the compute cluster decides the workspace."""

    name = forms.CharField(max_length=63, help_text="Unique in the workspace; lower-case letters, digits, hyphens.")
    compute_cluster = forms.ModelChoiceField(queryset=ComputeCluster.objects.none(), empty_label=None)
    ray_version = forms.ChoiceField(
        label="Ray version",
        help_text="Installed on the head and worker containers. The process runtime runs the agent's own Ray.",
    )
    runtime = forms.ChoiceField(choices=RayRuntime.choices, initial=RayRuntime.DOCKER)
    min_workers = forms.IntegerField(min_value=0, max_value=1000, initial=0)
    max_workers = forms.IntegerField(
        min_value=0, max_value=1000, initial=10, help_text="At most the compute cluster's nodes minus one."
    )
    idle_timeout_s = forms.IntegerField(min_value=1, max_value=86400, initial=60, label="Idle timeout (s)")
    checkpoint_on_stop = forms.BooleanField(required=False, label="Checkpoint jobs before stopping")
    gcs_port = forms.IntegerField(min_value=1, max_value=65535, initial=6379, label="GCS port")
    dashboard_port = forms.IntegerField(min_value=1, max_value=65535, initial=8265)

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        versions = list(dict.fromkeys([*settings.RAY_VERSIONS, settings.RAY_PROCESS_VERSION]))
        self.fields["ray_version"].choices = [(v, v) for v in versions]
        self.fields["ray_version"].initial = default_ray_version()
        operated = workspace_ids(user=user, roles=Role.operators())
        self.fields["compute_cluster"].queryset = (
            ComputeCluster.objects.filter(workspace_id__in=operated).select_related("workspace").order_by("name")
        )
        self.fields["compute_cluster"].label_from_instance = lambda c: f"{c.name} ({c.workspace.name})"

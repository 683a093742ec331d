"""Page forms of workloads: a new endpoint on a cluster's Endpoints tab (Owner/Admin)."""

from __future__ import annotations

from typing import Any

from django import forms

from fleet.workloads.services import MAX_IDLE_TIMEOUT_S, MAX_REPLICAS


class EndpointCreateForm(forms.Form):
    """`endpoint_create`'s inputs: a model cached on the cluster's nodes, its replicas, scale to zero."""

    model_id = forms.ChoiceField(label="Model", help_text="Models in the cache of this cluster's nodes.")
    revision = forms.CharField(max_length=200, initial="main")
    gpus = forms.IntegerField(min_value=0, max_value=64, initial=0, label="GPUs")
    min_vram_mb = forms.IntegerField(min_value=0, max_value=16 * 1024 * 1024, initial=0, label="Min VRAM (MB)")
    public = forms.BooleanField(required=False, help_text="Callable without an API key.")
    min_replicas = forms.IntegerField(
        min_value=0,
        max_value=MAX_REPLICAS,
        initial=1,
        help_text="0: scale to zero when idle; the next request starts it again (it waits for the start).",
    )
    max_replicas = forms.IntegerField(min_value=1, max_value=MAX_REPLICAS, required=False)
    idle_timeout_s = forms.IntegerField(
        min_value=1,
        max_value=MAX_IDLE_TIMEOUT_S,
        initial=300,
        label="Idle timeout (s)",
        help_text="With min replicas 0: seconds without requests before it scales to zero.",
    )

    def __init__(self, *args: Any, cached: dict[str, list[str]] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["model_id"].choices = [("", "— choose a cached model —")] + [
            (model, f"{model} (on {', '.join(names)})") for model, names in sorted((cached or {}).items())
        ]

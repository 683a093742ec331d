"""Page forms of workloads: a new endpoint on a cluster's Endpoints tab, and an endpoint's rolling update
(revision and server arguments, one shell-style line) — Owners, Admins and Members; an endpoint's per-key limits —
Owners and Admins."""

from __future__ import annotations

import shlex
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from fleet.workloads.models import RoutingPolicy
from fleet.workloads.services import (
    MAX_CONCURRENCY,
    MAX_GPUS,
    MAX_IDLE_TIMEOUT_S,
    MAX_PARALLEL,
    MAX_PER_MINUTE,
    MAX_QUEUE_DEPTH,
    MAX_QUEUE_WAIT_S,
    MAX_REPLICAS,
    MAX_REVISION,
    MAX_SCALE_COOLDOWN_S,
    MAX_TARGET_IN_FLIGHT,
    MAX_TARGET_REQUESTS_PER_MIN,
    MAX_TARGET_TOKENS_PER_S,
    MAX_VRAM_MB,
)


def server_args_line(args: list[str]) -> str:
    """Server arguments as the one line the forms show (quoted as a shell would)."""
    return shlex.join(args)


def parse_server_args_line(line: str) -> list[str]:
    """One line of server arguments split as a shell would (`--max-model-len 2048 --dtype half`)."""
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise ValidationError(f"Cannot parse the server arguments: {exc} (check the quotes).") from None


def _server_args_field() -> forms.CharField:
    return forms.CharField(
        max_length=40_000,
        required=False,
        strip=True,
        label="Server arguments",
        help_text=(
            "vLLM arguments, shell-style, e.g. --max-model-len 2048 --gpu-memory-utilization 0.8; only the "
            "flags on the allow-list (see the README's security section)"
        ),
    )


def _per_minute_field(label: str, help_text: str) -> forms.IntegerField:
    return forms.IntegerField(min_value=1, max_value=MAX_PER_MINUTE, required=False, label=label, help_text=help_text)


class EndpointLimitsForm(forms.Form):
    """An endpoint's per-key limits (empty: no limit), as `endpoint_set_key_limits` takes them."""

    key_requests_per_min = _per_minute_field(
        "Requests/min per key", "Each API key, and each member calling without a key (empty: no limit)."
    )
    key_tokens_per_min = _per_minute_field(
        "Tokens/min per key", "Prompt and completion tokens, each API key or member (empty: no limit)."
    )


def _routing_field(*, required: bool) -> forms.ChoiceField:
    return forms.ChoiceField(
        choices=RoutingPolicy.choices,
        initial=RoutingPolicy.LEAST_LOAD,
        required=required,
        label="Routing policy",
        help_text=(
            "Least load: the replica with the fewest requests in flight. Session: the same X-Session-Id, "
            "OpenAI user or API key to the same replica. Prefix: the same leading prompt text to the same "
            "replica (its prefix cache). Both affinity policies pass a request on when its replica is busier "
            "than the others."
        ),
    )


class EndpointAdmissionForm(forms.Form):
    """An endpoint's concurrency limit per replica and queue bounds (empty: the default), as
    `endpoint_set_admission` takes them."""

    max_concurrency = forms.IntegerField(
        min_value=1,
        max_value=MAX_CONCURRENCY,
        required=False,
        label="Requests in flight per replica",
        help_text="Empty: the server's --max-num-seqs, else 256. More wait in the queue.",
    )
    queue_max_depth = forms.IntegerField(
        min_value=0,
        max_value=MAX_QUEUE_DEPTH,
        required=False,
        label="Queue depth",
        help_text="Requests that may wait (empty: the default; 0: none, refused with 429 when full).",
    )
    queue_max_wait_s = forms.IntegerField(
        min_value=1,
        max_value=MAX_QUEUE_WAIT_S,
        required=False,
        label="Max wait (s)",
        help_text="Then 429 with Retry-After (empty: the default). Counts a cold start too.",
    )


class EndpointCreateForm(forms.Form):
    """`endpoint_create`'s inputs: a model cached on the cluster's nodes, its replicas, scale to zero."""

    model_id = forms.ChoiceField(label="Model", help_text="Models in the cache of this cluster's nodes.")
    revision = forms.CharField(max_length=MAX_REVISION, initial="main")
    gpus = forms.IntegerField(
        min_value=0,
        max_value=MAX_GPUS,
        initial=0,
        label="GPUs",
        help_text="0 still holds one GPU on a node with GPUs, counted against the workspace's quota",
    )
    min_vram_mb = forms.IntegerField(min_value=0, max_value=MAX_VRAM_MB, initial=0, label="Min VRAM (MB)")
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
    target_in_flight = forms.IntegerField(
        min_value=0,
        max_value=MAX_TARGET_IN_FLIGHT,
        required=False,
        label="Target requests in flight",
        help_text="Per replica; the autoscaler adds replicas above it (0 or empty: off).",
    )
    target_tokens_per_s = forms.IntegerField(
        min_value=0,
        max_value=MAX_TARGET_TOKENS_PER_S,
        required=False,
        label="Target tokens/s",
        help_text="Per replica.",
    )
    target_requests_per_min = forms.IntegerField(
        min_value=0,
        max_value=MAX_TARGET_REQUESTS_PER_MIN,
        required=False,
        label="Target requests/min",
        help_text="Per replica.",
    )
    target_queued = forms.IntegerField(
        min_value=0,
        max_value=MAX_TARGET_IN_FLIGHT,
        required=False,
        label="Target requests queued",
        help_text="Per replica: requests waiting for a free slot (0 or empty: off).",
    )
    scale_cooldown_s = forms.IntegerField(
        min_value=0,
        max_value=MAX_SCALE_COOLDOWN_S,
        initial=120,
        required=False,
        label="Cool-down (s)",
        help_text="Between two scaling changes (default 120).",
    )
    server_args = _server_args_field()
    key_requests_per_min = EndpointLimitsForm.base_fields["key_requests_per_min"]
    key_tokens_per_min = EndpointLimitsForm.base_fields["key_tokens_per_min"]
    routing_policy = _routing_field(required=False)  # left out: least load, the default
    ray_cluster = forms.ChoiceField(
        required=False,
        label="Ray cluster",
        help_text="Instead of a node: one vLLM group across a running Ray cluster's nodes (the head's serves the "
        "API); one replica, no autoscaling.",
    )
    pipeline_parallel = forms.IntegerField(
        min_value=1,
        max_value=MAX_PARALLEL,
        initial=1,
        required=False,
        label="Pipeline stages",
        help_text="With a Ray cluster: one per Ray node (head and workers).",
    )
    tensor_parallel = forms.IntegerField(
        min_value=1,
        max_value=MAX_PARALLEL,
        initial=1,
        required=False,
        label="Tensor parallel",
        help_text="With a Ray cluster: GPUs per Ray node (1 on nodes without GPUs).",
    )

    def __init__(
        self,
        *args: Any,
        cached: dict[str, list[str]] | None = None,
        ray_clusters: list[tuple[str, str]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.fields["ray_cluster"].choices = [("", "— none: on a node —"), *(ray_clusters or [])]
        choices = [("", "— choose a cached model —")] + [
            (model, f"{model} (on {', '.join(names)})") for model, names in sorted((cached or {}).items())
        ]
        asked = str(self.initial.get("model_id") or "")
        if asked and asked not in (cached or {}):  # from the catalog's Deploy: not downloaded here yet
            choices.append((asked, f"{asked} (not cached yet: download it first)"))
        self.fields["model_id"].choices = choices

    def clean_server_args(self) -> list[str]:
        return parse_server_args_line(self.cleaned_data["server_args"])


class EndpointUpdateForm(forms.Form):
    """A rolling update from the Endpoints page: the revision and server arguments to roll over to."""

    revision = forms.CharField(max_length=MAX_REVISION)
    server_args = _server_args_field()

    def clean_server_args(self) -> list[str]:
        return parse_server_args_line(self.cleaned_data["server_args"])

    def changes(self) -> dict[str, Any]:
        """The service's keyword arguments."""
        return {"revision": self.cleaned_data["revision"], "server_args": self.cleaned_data["server_args"]}


class EndpointRoutingForm(forms.Form):
    """The endpoint page's routing policy (changed at once, without a rolling update)."""

    routing_policy = _routing_field(required=True)

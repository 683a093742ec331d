"""Page forms: cluster creation, node rename, and one command form per command type.

Forms only shape input; the services validate the rules (and their field errors are put back on
the matching form field).
"""

from __future__ import annotations

import shlex
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from fleet.models import CommandType, Mode, Node


class ClusterForm(forms.Form):
    """Create a compute cluster in one of the user's operable workspaces."""

    workspace = forms.ChoiceField()
    name = forms.CharField(max_length=100)
    description = forms.CharField(
        max_length=2000, required=False, widget=forms.Textarea(attrs={"rows": 2}), help_text="Optional."
    )
    mode = forms.ChoiceField(
        choices=Mode.choices,
        label="Orchestration mode",
        help_text="Cannot be changed after the cluster is created.",
        widget=forms.Select(attrs={"aria-describedby": "id_mode_helptext"}),
    )
    argocd_server = forms.CharField(max_length=500, required=False, label="ArgoCD server")
    argocd_token = forms.CharField(
        max_length=4000, required=False, label="ArgoCD token", widget=forms.PasswordInput(render_value=False)
    )
    git_repo_url = forms.CharField(max_length=500, required=False, label="Git repository URL")
    git_branch = forms.CharField(max_length=200, required=False, initial="main", label="Git branch")

    def __init__(self, *args: Any, workspaces: Any = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["workspace"].choices = [(str(w.pk), w.name) for w in workspaces]


class ClusterSettingsForm(forms.Form):
    """Edit a cluster; the mode is shown, never editable (a posted `mode` is passed on and refused)."""

    name = forms.CharField(max_length=100)
    description = forms.CharField(max_length=2000, required=False, widget=forms.Textarea(attrs={"rows": 2}))
    argocd_server = forms.CharField(max_length=500, required=False, label="ArgoCD server")
    argocd_token = forms.CharField(
        max_length=4000,
        required=False,
        label="ArgoCD token",
        widget=forms.PasswordInput(render_value=False),
        help_text="Leave blank to keep the stored token.",
    )
    git_repo_url = forms.CharField(max_length=500, required=False, label="Git repository URL")
    git_branch = forms.CharField(max_length=200, required=False, label="Git branch")

    def changes(self, posted_mode: str | None) -> dict[str, Any]:
        """The posted fields (the ArgoCD ones are posted only for argocd clusters); a blank token keeps the old."""
        data = {k: v for k, v in self.cleaned_data.items() if k in self.data}
        if not data.get("argocd_token"):
            data.pop("argocd_token", None)
        if posted_mode is not None:
            data["mode"] = posted_mode
        return data


class RenameForm(forms.Form):
    """Rename a node."""

    name = forms.CharField(max_length=100)


class CommandForm(forms.Form):
    """Base of the per-type command forms: `to_payload()` builds the command payload."""

    command_type: str = ""

    def to_payload(self) -> dict[str, Any]:
        return {k: v for k, v in self.cleaned_data.items() if v not in (None, "", [], {})}


def _lines(value: str, *, sep: str, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in value.splitlines():
        line = line.strip()
        if not line:
            continue
        if sep not in line:
            raise ValidationError(f"Each line must look like {what}.")
        key, val = line.split(sep, 1)
        out[key.strip()] = val.strip()
    return out


class ContainerCreateForm(CommandForm):
    """container.create."""

    command_type = CommandType.CONTAINER_CREATE
    image = forms.CharField(max_length=500, help_text="e.g. nginx:1.27")
    name = forms.CharField(max_length=128)
    command = forms.CharField(max_length=2000, required=False, help_text="Command line (shell-style quoting)")
    command_secret = forms.BooleanField(
        required=False, label="Command line is secret", help_text="Stored encrypted and shown masked, like env values"
    )
    env = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="KEY=VALUE per line; values are stored encrypted and shown masked",
    )
    ports = forms.CharField(
        max_length=500, required=False, help_text="container port, or host:container[/udp], comma separated"
    )
    cpu = forms.FloatField(required=False, min_value=0)
    memory_mb = forms.IntegerField(required=False, min_value=0, label="Memory (MB)")
    gpus = forms.IntegerField(required=False, min_value=0, label="GPUs")
    registry_username = forms.CharField(max_length=200, required=False)
    registry_password = forms.CharField(max_length=2000, required=False, widget=forms.PasswordInput(render_value=False))

    def clean_command(self) -> list[str]:
        try:
            return shlex.split(self.cleaned_data["command"])
        except ValueError as exc:
            raise ValidationError(f"Cannot parse the command line: {exc}") from None

    def to_payload(self) -> dict[str, Any]:
        payload = super().to_payload()
        if payload.pop("command_secret", False):
            payload["secret_fields"] = ["command"]
        return payload

    def clean_env(self) -> dict[str, str]:
        return _lines(self.cleaned_data["env"], sep="=", what="KEY=VALUE")

    def clean_ports(self) -> list[dict[str, Any]]:
        ports = []
        for item in filter(None, (p.strip() for p in self.cleaned_data["ports"].split(","))):
            spec, _, proto = item.partition("/")
            host, _, container = spec.rpartition(":")
            try:
                entry: dict[str, Any] = {"container_port": int(container)}
                if host:
                    entry["host_port"] = int(host)
            except ValueError:
                raise ValidationError(f"{item!r} is not a port mapping like 8080:80.") from None
            if proto:
                entry["protocol"] = proto
            ports.append(entry)
        return ports


class ContainerRefForm(CommandForm):
    """container.start / stop / destroy."""

    container = forms.CharField(max_length=255, help_text="Container id or name")
    timeout_s = forms.IntegerField(required=False, min_value=0, max_value=3600, label="Stop timeout (s)")


class ModelDownloadForm(CommandForm):
    """model.download."""

    command_type = CommandType.MODEL_DOWNLOAD
    model_id = forms.CharField(max_length=200, help_text="Hugging Face model id, e.g. Qwen/Qwen2.5-0.5B")
    revision = forms.CharField(max_length=200, required=False, initial="main")


class EndpointStartForm(CommandForm):
    """endpoint.start: offers only the models cached on the cluster's nodes (each labelled with them);
    `check_target` refuses a node that does not hold the chosen one."""

    command_type = CommandType.ENDPOINT_START
    model_id = forms.ChoiceField(label="Model", help_text="Models in the cache of this cluster's nodes.")
    revision = forms.CharField(max_length=200, required=False)
    endpoint_id = forms.CharField(
        max_length=12, required=False, help_text="Leave blank for a new endpoint; an endpoint's id restarts it."
    )
    port = forms.IntegerField(required=False, min_value=0, max_value=65535)
    gpus = forms.IntegerField(required=False, min_value=0, label="GPUs")
    extra_args = forms.CharField(
        max_length=40_000,
        required=False,
        label="Server arguments",
        help_text="vLLM arguments every replica starts with, shell-style, e.g. --max-model-len 2048",
    )

    def clean_extra_args(self) -> list[str]:
        try:
            return shlex.split(self.cleaned_data["extra_args"])
        except ValueError as exc:
            raise ValidationError(f"Cannot parse the server arguments: {exc} (check the quotes).") from None

    def __init__(self, *args: Any, cached: dict[str, list[str]] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cached = cached or {}  # model id → names of the nodes holding it
        self.fields["model_id"].choices = [("", "— choose a cached model —")] + [
            (model, f"{model} (on {', '.join(names)})") for model, names in sorted(self.cached.items())
        ]

    def check_target(self, node: Node | None) -> bool:
        """False (with the reason on `model_id`) when `node` does not hold the chosen model."""
        model = self.cleaned_data.get("model_id", "")
        if node is not None and node.name not in self.cached.get(model, []):
            self.add_error(
                "model_id", f"model weights are not yet downloaded on {node.name}: run model.download on it first"
            )
            return False
        return True


class EndpointStopForm(CommandForm):
    """endpoint.stop."""

    command_type = CommandType.ENDPOINT_STOP
    endpoint_id = forms.CharField(max_length=100)


COMMAND_FORMS: dict[str, type[CommandForm]] = {
    CommandType.CONTAINER_CREATE: ContainerCreateForm,
    CommandType.CONTAINER_START: ContainerRefForm,
    CommandType.CONTAINER_STOP: ContainerRefForm,
    CommandType.CONTAINER_DESTROY: ContainerRefForm,
    CommandType.MODEL_DOWNLOAD: ModelDownloadForm,
    CommandType.ENDPOINT_START: EndpointStartForm,
    CommandType.ENDPOINT_STOP: EndpointStopForm,
}


class TargetForm(forms.Form):
    """Which command and where: every online node, or one node of the cluster.

    Only the commands an operator sends by hand are offered (those with a form); the `ray.*` commands
    are the Ray manager's own and never offered here.
    """

    command_type = forms.ChoiceField(choices=[(t, CommandType(t).label) for t in COMMAND_FORMS])
    target = forms.ChoiceField()

    def __init__(self, *args: Any, nodes: list[Node] = (), **kwargs: Any) -> None:  # type: ignore[assignment]
        super().__init__(*args, **kwargs)
        self.nodes = {str(n.pk): n for n in nodes}
        self.fields["target"].choices = [("all", "All nodes (every online node)")] + [
            (str(n.pk), f"{n.name} · {n.short_id} ({n.status})") for n in nodes
        ]

    def target_node(self) -> Node | None:
        value = self.cleaned_data["target"]
        return None if value == "all" else self.nodes[value]


def apply_service_errors(form: forms.Form, exc: ValidationError) -> None:
    """Put a service `ValidationError` onto the form (payload.X → field X, others non-field)."""
    for key, messages in exc.message_dict.items():
        field = key.removeprefix("payload.")
        for message in messages:
            form.add_error(
                field if field in form.fields else None, f"{message}" if field in form.fields else f"{key}: {message}"
            )


class NamespaceForm(forms.Form):
    """Create a namespace in one of the user's operable workspaces, optionally bound to a compute cluster."""

    workspace = forms.ChoiceField()
    name = forms.CharField(max_length=63, help_text="Lower-case letters, digits and hyphens (a DNS label).")
    cluster = forms.ChoiceField(required=False, label="Compute cluster")

    def __init__(self, *args: Any, workspaces: Any = (), clusters: Any = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["workspace"].choices = [(str(w.pk), w.name) for w in workspaces]
        self.fields["cluster"].choices = [("", "None (not bound)")] + [
            (str(c.pk), f"{c.name} ({c.workspace.name})") for c in clusters
        ]


class NamespaceBindForm(forms.Form):
    """Bind a namespace to a compute cluster of its workspace (empty: unbind)."""

    cluster = forms.UUIDField(required=False, label="Compute cluster")

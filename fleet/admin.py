"""Django admin for the fleet's core. Writes go through the services with `request.user`, so the
Owner/Admin rule holds here too; the cluster mode is read-only after creation.

The workload models' admins are in `fleet.workloads.admin`, registered at app start (`FleetConfig.ready`):
the admin's autodiscovery imports only this module."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from fleet import services
from fleet.models import (
    CertificateAuthority,
    ClusterEvent,
    Command,
    CommandType,
    ComputeCluster,
    JoinToken,
    Namespace,
    Node,
    NodeCertificate,
    NodeEvent,
    RevokedSerial,
)
from kernel.exceptions import IllegalTransition


def _errors(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return (
            "; ".join(f"{k}: {', '.join(v)}" for k, v in exc.message_dict.items())
            if hasattr(exc, "error_dict")
            else "; ".join(exc.messages)
        )
    return str(exc) or "Only workspace Owners and Admins can do this."


class ReadOnlyAdmin(admin.ModelAdmin):
    """Rows written only by services (tokens, certificates, commands, events)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ClusterAdminForm(forms.ModelForm):
    """Cluster form; the ArgoCD token is write-only (blank keeps the stored one)."""

    argocd_token = forms.CharField(
        required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Leave blank to keep the current token.",
    )

    class Meta:
        model = ComputeCluster
        fields = [
            "workspace",
            "name",
            "description",
            "mode",
            "argocd_server",
            "argocd_token",
            "git_repo_url",
            "git_branch",
        ]


@admin.register(ComputeCluster)
class ComputeClusterAdmin(admin.ModelAdmin):
    """Compute clusters; mode is read-only once created."""

    form = ClusterAdminForm
    list_display = ["name", "workspace", "mode", "created_at"]
    list_filter = ["mode", "workspace"]
    search_fields = ["name"]
    actions = ["generate_join_token"]

    def get_readonly_fields(self, request: HttpRequest, obj: ComputeCluster | None = None) -> list[str]:
        return ["workspace", "mode"] if obj is not None else []

    def save_model(self, request: HttpRequest, obj: ComputeCluster, form: Any, change: bool) -> None:
        fields = {k: v for k, v in form.cleaned_data.items() if k not in ("workspace", "mode")}
        if not fields.get("argocd_token"):
            fields.pop("argocd_token", None)
        try:
            if change:
                saved = services.cluster_update(actor=request.user, cluster=obj, **fields)
            else:
                saved = services.cluster_create(
                    actor=request.user,
                    workspace=form.cleaned_data["workspace"],
                    mode=form.cleaned_data["mode"],
                    **fields,
                )
        except (ValidationError, PermissionDenied) as exc:
            raise PermissionDenied(_errors(exc)) from exc
        obj.pk = saved.pk

    def delete_model(self, request: HttpRequest, obj: ComputeCluster) -> None:
        services.cluster_delete(actor=request.user, cluster=obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ComputeCluster]) -> None:
        for cluster in queryset:
            services.cluster_delete(actor=request.user, cluster=cluster)

    @admin.action(description="Generate a join token (shown once)")
    def generate_join_token(self, request: HttpRequest, queryset: QuerySet[ComputeCluster]) -> None:
        for cluster in queryset:
            try:
                _, raw = services.join_token_create(cluster=cluster, actor=request.user)
            except PermissionDenied as exc:
                self.message_user(request, f"{cluster}: {_errors(exc)}", messages.ERROR)
                continue
            self.message_user(request, f"{cluster}: {services.join_command(raw)}", messages.WARNING)


class SendCommandForm(forms.Form):
    """Admin: a command and its JSON payload for the selected nodes."""

    command_type = forms.ChoiceField(choices=CommandType.choices)
    payload = forms.CharField(widget=forms.Textarea(attrs={"rows": 6, "cols": 80}), initial="{}")

    def clean_payload(self) -> dict[str, Any]:
        try:
            value = json.loads(self.cleaned_data["payload"])
        except ValueError:
            raise ValidationError("Not valid JSON.") from None
        if not isinstance(value, dict):
            raise ValidationError("The payload must be a JSON object.")
        return value


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    """Nodes; status changes, deletion and commands go through the services."""

    list_display = ["name", "hostname", "cluster", "status", "connected", "containers_count", "last_heartbeat_at"]
    list_filter = ["status", "connected", "cluster"]
    search_fields = ["name", "hostname"]
    fields = [
        "name",
        "hostname",
        "cluster",
        "status",
        "connected",
        "last_heartbeat_at",
        "cpu_count",
        "memory_total_mb",
        "gpu_model",
        "gpu_count",
        "vram_total_mb",
        "containers_count",
        "agent_version",
        "os",
        "arch",
        "created_at",
    ]
    actions = ["cordon", "uncordon", "drain", "send_command"]

    def get_readonly_fields(self, request: HttpRequest, obj: Node | None = None) -> list[str]:
        return [f for f in self.fields if f != "name"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # nodes join with a token

    def save_model(self, request: HttpRequest, obj: Node, form: Any, change: bool) -> None:
        try:
            services.node_rename(node=obj, actor=request.user, name=form.cleaned_data["name"])
        except ValidationError as exc:
            raise PermissionDenied(_errors(exc)) from exc

    def delete_model(self, request: HttpRequest, obj: Node) -> None:
        services.node_delete(node=obj, actor=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        for node in queryset.select_related("cluster__workspace"):
            services.node_delete(node=node, actor=request.user)

    def _each(self, request: HttpRequest, queryset: QuerySet[Node], fn: Any) -> None:
        for node in queryset.select_related("cluster__workspace"):
            try:
                node = fn(node=node, actor=request.user)
            except (IllegalTransition, PermissionDenied) as exc:
                self.message_user(request, f"{node}: {_errors(exc)}", messages.ERROR)
            else:
                self.message_user(request, f"{node}: now {node.status}")

    @admin.action(description="Cordon")
    def cordon(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        self._each(request, queryset, services.node_cordon)

    @admin.action(description="Uncordon")
    def uncordon(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        self._each(request, queryset, services.node_uncordon)

    @admin.action(description="Drain")
    def drain(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        self._each(request, queryset, services.node_drain)

    @admin.action(description="Send a command")
    def send_command(self, request: HttpRequest, queryset: QuerySet[Node]) -> HttpResponse | None:
        form = SendCommandForm(request.POST if "apply" in request.POST else None)
        if "apply" in request.POST and form.is_valid():
            sent = 0
            for node in queryset.select_related("cluster__workspace"):
                try:
                    sent += len(
                        services.command_dispatch(
                            actor=request.user,
                            cluster=node.cluster,
                            command_type=form.cleaned_data["command_type"],
                            payload=form.cleaned_data["payload"],
                            node=node,
                        )
                    )
                except (ValidationError, PermissionDenied, IllegalTransition) as exc:
                    self.message_user(request, f"{node}: {_errors(exc)}", messages.ERROR)
            if sent:
                self.message_user(request, f"{sent} command(s) queued.")
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": "Send a command",
            "form": form,
            "nodes": queryset,
            "action": "send_command",
            "opts": self.model._meta,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "fleet/admin/send_command.html", context)


@admin.register(Command)
class CommandAdmin(ReadOnlyAdmin):
    """Commands (created by dispatch only)."""

    list_display = ["command_type", "node", "cluster", "status", "created_by", "system", "created_at"]
    list_filter = ["status", "command_type", "system"]
    exclude = ["secrets"]


@admin.register(NodeEvent)
class NodeEventAdmin(ReadOnlyAdmin):
    """The per-node event log."""

    list_display = ["created_at", "node", "kind", "message"]
    list_filter = ["kind"]


@admin.register(JoinToken)
class JoinTokenAdmin(ReadOnlyAdmin):
    """Join tokens (hashes only; mint them with the cluster action)."""

    list_display = ["cluster", "created_by", "created_at", "expires_at", "used_at", "node"]


@admin.register(NodeCertificate)
class NodeCertificateAdmin(ReadOnlyAdmin):
    """Issued node certificates."""

    list_display = ["serial", "node", "issued_at", "revoked_at"]


@admin.register(RevokedSerial)
class RevokedSerialAdmin(ReadOnlyAdmin):
    """The revocation list."""

    list_display = ["serial", "revoked_at", "reason"]


@admin.register(CertificateAuthority)
class CertificateAuthorityAdmin(ReadOnlyAdmin):
    """The control-plane CA (its private key is never shown)."""

    list_display = ["name", "created_at"]
    exclude = ["private_key"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Namespace)
class NamespaceAdmin(admin.ModelAdmin):
    """Namespaces and their cluster binding."""

    list_display = ["name", "workspace", "cluster"]
    list_filter = ["workspace"]

    def get_readonly_fields(self, request: HttpRequest, obj: Namespace | None = None) -> list[str]:
        return ["workspace", "name"] if obj is not None else []

    def save_model(self, request: HttpRequest, obj: Namespace, form: Any, change: bool) -> None:
        if change:
            services.namespace_bind(actor=request.user, namespace=obj, cluster_id=obj.cluster_id)
        else:
            saved = services.namespace_create(
                actor=request.user, workspace=obj.workspace, name=obj.name, cluster_id=obj.cluster_id
            )
            obj.pk = saved.pk

    def delete_model(self, request: HttpRequest, obj: Namespace) -> None:
        services.namespace_delete(actor=request.user, namespace=obj)


@admin.register(ClusterEvent)
class ClusterEventAdmin(ReadOnlyAdmin):
    """Cluster-wide events (partition safety pauses and resumes)."""

    list_display = ["cluster", "kind", "message", "created_at"]
    list_filter = ["kind"]

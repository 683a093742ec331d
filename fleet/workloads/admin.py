"""Django admin for the workload models: read-only (they change only through commands, inventory and
the services behind the API and pages, which check roles).

Registered at app start (`FleetConfig.ready` imports this module): the admin's autodiscovery imports only
`fleet.admin`.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from fleet.admin import ReadOnlyAdmin
from fleet.workloads.models import ApiKeyEndpoint, Container, Endpoint, EndpointEvent, EndpointReplica, NodeModel
from fleet.workloads.services.endpoints.limits import LIMIT_FIELDS, endpoint_set_key_limits


@admin.register(Container)
class ContainerAdmin(ReadOnlyAdmin):
    """Workload containers as the agents report them (changed only by commands and inventory)."""

    list_display = ["name", "node", "status", "image", "container_id", "updated_at"]
    list_filter = ["status"]
    search_fields = ["name", "container_id", "image"]


@admin.register(NodeModel)
class NodeModelAdmin(ReadOnlyAdmin):
    """Which models are cached on which node."""

    list_display = ["model_id", "revision", "node", "size_bytes", "updated_at"]
    search_fields = ["model_id"]


@admin.register(Endpoint)
class EndpointAdmin(admin.ModelAdmin):
    """Inference endpoints (started and stopped through the API or pages, which check roles); operators set
    an endpoint's per-key limits here, everything else is read only."""

    list_display = [
        "slug",
        "model_id",
        "node",
        "status",
        "port",
        "public",
        "min_replicas",
        "key_requests_per_min",
        "key_tokens_per_min",
        "created_at",
    ]
    list_filter = ["status", "public"]
    search_fields = ["slug", "model_id"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in Endpoint._meta.fields if f.name not in LIMIT_FIELDS]

    def save_model(self, request: HttpRequest, obj: Endpoint, form: Any, change: bool) -> None:
        limits = {name: form.cleaned_data.get(name) for name in LIMIT_FIELDS}
        endpoint_set_key_limits(actor=request.user, endpoint=obj, staff=True, **limits)


@admin.register(ApiKeyEndpoint)
class ApiKeyEndpointAdmin(ReadOnlyAdmin):
    """The endpoints an API key is limited to (set when the key is created)."""

    list_display = ["key", "endpoint"]


@admin.register(EndpointReplica)
class EndpointReplicaAdmin(ReadOnlyAdmin):
    """Endpoint replicas: one server of an endpoint on one node (placed and replaced by the services)."""

    list_display = ["server_id", "endpoint", "node", "status", "port", "replacement_of", "created_at"]
    list_filter = ["status"]
    search_fields = ["server_id", "endpoint__slug"]


@admin.register(EndpointEvent)
class EndpointEventAdmin(ReadOnlyAdmin):
    """An endpoint's event log: its replicas' starts, failures and replacements, the autoscaler's decisions."""

    list_display = ["created_at", "endpoint", "kind", "node", "message"]
    list_filter = ["kind"]
    search_fields = ["endpoint__slug", "message"]

"""Django admin for the workload models: read-only (they change only through commands, inventory and
the services behind the API and pages, which check roles).

Registered at app start (`FleetConfig.ready` imports this module): the admin's autodiscovery imports only
`fleet.admin`.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import path

from fleet.admin import ReadOnlyAdmin
from fleet.workloads.catalog import CatalogError
from fleet.workloads.models import (
    ApiKeyEndpoint,
    CatalogModel,
    Container,
    Endpoint,
    EndpointAdapter,
    EndpointBenchmark,
    EndpointEvent,
    EndpointReplica,
    LoraAdapter,
    NodeCache,
    NodeModel,
)
from fleet.workloads.services.catalog import catalog_import
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

    list_display = ["model_id", "revision", "node", "size_bytes", "last_used_at", "updated_at"]
    search_fields = ["model_id"]


@admin.register(NodeCache)
class NodeCacheAdmin(ReadOnlyAdmin):
    """Each node's model cache: disk free and budget as reported, the budget set (on the node's page or API)."""

    list_display = ["node", "disk_free_bytes", "budget_mb", "reported_budget_bytes", "reported_at"]


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


@admin.register(LoraAdapter)
class LoraAdapterAdmin(ReadOnlyAdmin):
    """A workspace's LoRA adapters (its members add them on the API)."""

    list_display = ["name", "workspace", "model_id", "revision", "path", "created_at"]
    search_fields = ["name", "model_id"]


@admin.register(EndpointAdapter)
class EndpointAdapterAdmin(ReadOnlyAdmin):
    """Which adapters are attached to which endpoints."""

    list_display = ["adapter", "endpoint", "created_at"]


@admin.register(EndpointBenchmark)
class EndpointBenchmarkAdmin(ReadOnlyAdmin):
    """Benchmark runs of endpoints and their reports (started on the endpoint's page or API)."""

    list_display = ["endpoint", "status", "concurrency", "duration_s", "revision", "routing_policy", "created_at"]
    list_filter = ["status"]


@admin.register(EndpointEvent)
class EndpointEventAdmin(ReadOnlyAdmin):
    """An endpoint's event log: its replicas' starts, failures and replacements, the autoscaler's decisions."""

    list_display = ["created_at", "endpoint", "kind", "node", "message"]
    list_filter = ["kind"]
    search_fields = ["endpoint__slug", "message"]


@admin.register(CatalogModel)
class CatalogModelAdmin(admin.ModelAdmin):
    """The model catalog: curated models come from the repository's file (read only here; *Refresh from the
    repository's catalog* imports it again after an edit, as `manage.py catalog_import` does), private models
    belong to their workspace."""

    change_list_template = "fleet/admin/catalog_changelist.html"
    list_display = ["name", "model_id", "workspace", "params_b", "context_length", "catalog_version", "updated_at"]
    list_filter = [("workspace", admin.EmptyFieldListFilter)]
    search_fields = ["name", "model_id", "description"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # curated: the file; private: the Models page or API (they check roles)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        refresh = path("refresh/", self.admin_site.admin_view(self.refresh_view), name="fleet_catalogmodel_refresh")
        return [refresh, *super().get_urls()]

    def refresh_view(self, request: HttpRequest) -> HttpResponse:
        """POST: import the catalog file again (curated rows made exactly the file's)."""
        if request.method != "POST" or not request.user.has_perm("fleet.delete_catalogmodel"):
            raise PermissionDenied("Refreshing the catalog takes a POST by an operator who may change it.")
        try:
            outcome = catalog_import()
        except CatalogError as exc:
            messages.error(request, f"The catalog file is invalid, nothing changed: {exc}")
        else:
            messages.success(
                request,
                f"Catalog version {outcome['version']}: {outcome['created']} added, {outcome['updated']} updated, "
                f"{outcome['removed']} removed.",
            )
        return redirect("admin:fleet_catalogmodel_changelist")

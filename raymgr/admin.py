"""Admin for managed Ray (read-mostly: state changes go through the services)."""

from __future__ import annotations

from django.contrib import admin

from raymgr.models import RayCluster, RayClusterEvent, RayNode
from raymgr.workloads.models import ServeDeployment, TrainingJob, TuneExperiment, TuneTrial


class RayNodeInline(admin.TabularInline):
    """A cluster's Ray nodes."""

    model = RayNode
    extra = 0
    fields = ["role", "node", "status", "container_id", "ray_node_id", "ip", "running_tasks", "idle_s"]
    readonly_fields = fields
    can_delete = False


@admin.register(RayCluster)
class RayClusterAdmin(admin.ModelAdmin):
    """Ray clusters; status fields are read-only (use Start/Stop/Delete on the page or API)."""

    list_display = ["name", "workspace", "compute_cluster", "status", "status_changed_at", "ray_version", "runtime"]
    list_filter = ["status", "runtime"]
    search_fields = ["name", "head_hostname"]
    readonly_fields = [
        "status",
        "status_changed_at",
        "failure_reason",
        "head_node",
        "head_hostname",
        "head_ip",
        "head_container_id",
        "last_status",
        "last_status_at",
        "last_decided_status_at",
        "created_at",
        "started_at",
    ]
    inlines = [RayNodeInline]


@admin.register(RayClusterEvent)
class RayClusterEventAdmin(admin.ModelAdmin):
    """Ray cluster events."""

    list_display = ["created_at", "ray_cluster", "kind", "message"]
    list_filter = ["kind"]
    readonly_fields = ["ray_cluster", "kind", "message", "data", "created_at"]


@admin.register(RayNode)
class RayNodeAdmin(admin.ModelAdmin):
    """Heads and workers of every Ray cluster (written by the Ray services from command results)."""

    list_display = ["ray_cluster", "role", "node", "status", "container_id"]
    list_filter = ["role", "status"]

    def has_add_permission(self, request, obj=None) -> bool:  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None) -> bool:  # type: ignore[no-untyped-def]
        return False


@admin.register(TrainingJob)
class TrainingJobAdmin(admin.ModelAdmin):
    """Training jobs submitted to Ray clusters."""

    list_display = ["name", "ray_cluster", "status", "created_at"]
    list_filter = ["status"]


@admin.register(ServeDeployment)
class ServeDeploymentAdmin(admin.ModelAdmin):
    """Ray Serve deployments."""

    list_display = ["name", "ray_cluster", "status", "created_at"]
    list_filter = ["status"]


class TuneTrialInline(admin.TabularInline):
    """An experiment's trials."""

    model = TuneTrial
    extra = 0
    can_delete = False


@admin.register(TuneExperiment)
class TuneExperimentAdmin(admin.ModelAdmin):
    """Tune experiments and their trials."""

    list_display = ["name", "ray_cluster", "status", "created_at"]
    list_filter = ["status"]
    inlines = [TuneTrialInline]


admin.site.register(TuneTrial)

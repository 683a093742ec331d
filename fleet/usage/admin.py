"""Django admin for usage rollups: read-only (the meter and the sampling task write them)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from fleet.usage.models import UsageRollup


@admin.register(UsageRollup)
class UsageRollupAdmin(admin.ModelAdmin):
    """Minute and hour rollups per workspace, subject and API key, for operators to look up a figure."""

    list_display = (
        "bucket_start",
        "granularity",
        "workspace",
        "subject_kind",
        "subject_id",
        "api_key_id",
        "requests",
        "errors",
        "prompt_tokens",
        "completion_tokens",
    )
    list_filter = ("granularity", "subject_kind")
    search_fields = ("subject_id",)
    date_hierarchy = "bucket_start"

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

"""Django admin for the audit trail: read-only (entries are written only by the audited services)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    """Search and read entries; nobody adds, changes or deletes them here."""

    list_display = ("created_at", "workspace", "actor_name", "action", "target_type", "target_name", "outcome")
    list_filter = ("outcome", "action", "target_type", "workspace")
    search_fields = ("actor_name", "action", "target_name", "target_id", "reason", "git_commit")
    date_hierarchy = "created_at"
    list_select_related = ("workspace",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

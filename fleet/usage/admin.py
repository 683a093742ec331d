"""Django admin for usage rollups: read-only (the meter and the sampling task write them)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django import forms
from django.contrib import admin

from fleet.admin import ReadOnlyAdmin
from fleet.usage import services
from fleet.usage.models import Budget, PriceVersion, UsageRollup


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


class PriceVersionForm(forms.ModelForm):
    """A new price version, checked by the service's rules (a refusal is a field error, never a 500)."""

    class Meta:
        model = PriceVersion
        fields = ("effective_from", *services.PRICE_FIELDS)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if not self.errors:
            version = PriceVersion(**{name: data.get(name) for name in self.Meta.fields})
            for name, message in services.price_version_errors(version, now=datetime.now(UTC)).items():
                self.add_error(name if name in self.fields else None, message)
        return data


@admin.register(PriceVersion)
class PriceVersionAdmin(admin.ModelAdmin):
    """The price table's versions: operators add one (through `services.price_version_create`), never edit."""

    form = PriceVersionForm
    list_display = ("effective_from", "currency", "node_hour", "gpu_hour", "cpu_core_hour", "memory_gib_hour")

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def save_model(self, request: Any, obj: PriceVersion, form: Any, change: bool) -> None:
        fields = {name: getattr(obj, name) for name in services.PRICE_FIELDS}
        saved = services.price_version_create(actor=request.user, effective_from=obj.effective_from, **fields)
        obj.pk = saved.pk


@admin.register(Budget)
class BudgetAdmin(ReadOnlyAdmin):
    """Monthly budgets as Owners set them on the API, with the month's spend; the webhook (its path may hold a
    secret) is not shown."""

    list_display = ["workspace", "api_key", "token_limit", "money_limit", "hard_stop", "month", "level"]
    list_filter = ["level", "hard_stop"]
    exclude = ["webhook_url"]

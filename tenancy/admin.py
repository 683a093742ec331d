"""Django admin for workspaces, memberships and quotas; role and quota changes go through the services."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from guardian.admin import GuardedModelAdmin

from tenancy import services
from tenancy.models import ApiKey, Membership, SsoIdentity, Workspace, WorkspaceQuota
from tenancy.quotas import QUOTAS


class MembershipInline(admin.TabularInline):
    """Members of a workspace, edited in place (saving one by hand takes it over from the SSO mapping)."""

    model = Membership
    extra = 0
    autocomplete_fields = ["user"]
    readonly_fields = ["granted_by_sso"]


@admin.register(Workspace)
class WorkspaceAdmin(GuardedModelAdmin):
    """Workspaces with their members."""

    list_display = ["name", "slug", "created_at"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]

    def save_model(self, request: Any, obj: Workspace, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        WorkspaceQuota.objects.get_or_create(workspace=obj)  # every limit empty: unlimited

    def save_formset(self, request: Any, form: Any, formset: Any, change: bool) -> None:
        instances = formset.save(commit=False)
        for obj in formset.deleted_objects:
            services.membership_remove(workspace=obj.workspace, user=obj.user)
        for membership in instances:
            services.membership_set(workspace=membership.workspace, user=membership.user, role=membership.role)


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    """Memberships; saving re-syncs the member's object permissions."""

    list_display = ["user", "workspace", "role", "granted_by_sso", "created_at"]
    list_filter = ["role", "granted_by_sso", "workspace"]
    search_fields = ["user__username", "workspace__name"]
    autocomplete_fields = ["user"]
    readonly_fields = ["granted_by_sso"]

    def save_model(self, request: Any, obj: Membership, form: Any, change: bool) -> None:
        services.membership_set(workspace=obj.workspace, user=obj.user, role=obj.role)

    def delete_model(self, request: Any, obj: Membership) -> None:
        services.membership_remove(workspace=obj.workspace, user=obj.user)


@admin.register(SsoIdentity)
class SsoIdentityAdmin(admin.ModelAdmin):
    """Who signs in through the OpenID Connect provider, as which subject (read-only: sign-ins write it)."""

    list_display = ["user", "issuer", "subject", "last_sign_in_at"]
    search_fields = ["user__username", "subject"]
    readonly_fields = ["user", "issuer", "subject", "claim_values", "created_at", "last_sign_in_at"]

    def has_add_permission(self, request: Any) -> bool:
        return False


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """API keys: their public part and use; the secret is never stored, so never shown. Create them in
    Settings → API keys (or the API); here staff can see and revoke them."""

    list_display = ("name", "display", "user", "workspace", "scopes", "expires_at", "last_used_at", "revoked_at")
    list_filter = ("workspace",)
    search_fields = ("name", "prefix", "user__username")
    readonly_fields = (
        "user",
        "workspace",
        "prefix",
        "secret_hash",
        "scopes",
        "last_used_at",
        "last_used_ip",
        "created_at",
    )
    fields = (*readonly_fields, "name", "requests_per_min", "tokens_per_min", "expires_at", "revoked_at")

    def has_add_permission(self, request: Any) -> bool:
        return False


@admin.register(WorkspaceQuota)
class WorkspaceQuotaAdmin(admin.ModelAdmin):
    """Operators set any workspace's quotas here; each change is audited like an Owner's."""

    list_display = ["workspace", *(q.name for q in QUOTAS), "updated_at"]
    search_fields = ["workspace__name", "workspace__slug"]
    readonly_fields = ["workspace", "updated_at"]

    def has_add_permission(self, request: Any) -> bool:
        return False  # one row per workspace, made with it

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def save_model(self, request: Any, obj: WorkspaceQuota, form: Any, change: bool) -> None:
        limits = {q.name: form.cleaned_data.get(q.name) for q in QUOTAS}
        services.workspace_quota_set(actor=request.user, workspace=obj.workspace, limits=limits, staff=True)

"""Serializers for workspaces and memberships."""

from __future__ import annotations

from rest_framework import serializers

from kernel.api import NoUnknownFields
from tenancy.models import Membership, Workspace
from tenancy.quotas import LIMIT_MAX, QUOTAS, Quota


class WorkspaceSerializer(serializers.ModelSerializer):
    """A workspace and the caller's role in it."""

    role = serializers.SerializerMethodField()

    class Meta:
        model = Workspace
        fields = ["id", "name", "slug", "created_at", "role"]
        read_only_fields = fields

    def get_role(self, obj: Workspace) -> str | None:
        roles: dict = self.context.get("roles", {})
        return roles.get(obj.pk)


class MembershipSerializer(serializers.ModelSerializer):
    """A member of a workspace."""

    username = serializers.CharField(source="user.username", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "username", "role", "created_at"]
        read_only_fields = fields


class QuotaLineSerializer(serializers.Serializer):
    """One quota: its limit (null: unlimited) and what the workspace has in use against it."""

    quota = serializers.ChoiceField(choices=[q.name for q in QUOTAS], read_only=True)
    label = serializers.CharField(read_only=True)
    unit = serializers.CharField(read_only=True, help_text='"GiB" for memory and VRAM, "" for counts and cores.')
    limit = serializers.FloatField(read_only=True, allow_null=True)
    in_use = serializers.FloatField(read_only=True)
    percent = serializers.IntegerField(read_only=True, allow_null=True)


class QuotasSerializer(serializers.Serializer):
    """A workspace's quotas and usage."""

    workspace = serializers.UUIDField(read_only=True)
    can_edit = serializers.BooleanField(read_only=True, help_text="Whether the caller (its Owner) may set them.")
    quotas = QuotaLineSerializer(many=True, read_only=True)


def _limit_field(quota: Quota) -> serializers.Field:
    kind = serializers.IntegerField if quota.whole else serializers.FloatField
    return kind(required=False, allow_null=True, min_value=0, max_value=LIMIT_MAX)


# New limits (only those given change; null makes a quota unlimited): one field per quota of `QUOTAS`, as the
# page's form and the admin derive theirs.
QuotaLimitsSerializer: type[serializers.Serializer] = type(
    "QuotaLimitsSerializer",
    (NoUnknownFields,),
    {
        "__doc__": "New limits (only those given change; null makes a quota unlimited; an unknown name: 400).",
        "__module__": __name__,
        **{quota.name: _limit_field(quota) for quota in QUOTAS},
    },
)

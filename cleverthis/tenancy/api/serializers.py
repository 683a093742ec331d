"""Serializers for workspaces and memberships."""

from __future__ import annotations

from rest_framework import serializers

from cleverthis.tenancy.models import Membership, Workspace


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

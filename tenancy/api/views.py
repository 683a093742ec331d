"""API for the caller's workspaces, their members, and their quotas (the Owner sets them)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from kernel.api import ServiceErrorsMixin, validated
from tenancy import services
from tenancy.api.serializers import (
    MembershipSerializer,
    QuotaLimitsSerializer,
    QuotasSerializer,
    WorkspaceSerializer,
)
from tenancy.mixins import WorkspaceScopedMixin
from tenancy.models import Membership, Workspace
from tenancy.permissions import is_owner
from tenancy.quotas import quota_report


class WorkspaceViewSet(ServiceErrorsMixin, WorkspaceScopedMixin, viewsets.ReadOnlyModelViewSet):
    """Workspaces the caller belongs to; others are 404."""

    serializer_class = WorkspaceSerializer
    queryset = Workspace.objects.all()
    workspace_field = "pk"

    def get_base_queryset(self) -> QuerySet[Workspace]:
        return Workspace.objects.order_by("name")

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        if self.request.user.is_authenticated:
            context["roles"] = dict(
                Membership.objects.filter(user=self.request.user).values_list("workspace_id", "role")
            )
        return context

    @extend_schema(responses={200: MembershipSerializer(many=True)})
    @action(detail=True, methods=["get"], serializer_class=MembershipSerializer, pagination_class=None)
    def members(self, request: Request, pk: str | None = None) -> Response:
        """Members of one workspace."""
        workspace = self.get_object()
        memberships = workspace.memberships.select_related("user").order_by("user__username")
        return Response(MembershipSerializer(memberships, many=True).data)

    def _quotas(self, workspace: Workspace) -> Response:
        body = {
            "workspace": workspace.pk,
            "can_edit": is_owner(self.request.user, workspace),
            "quotas": quota_report([workspace.pk])[workspace.pk],
        }
        return Response(QuotasSerializer(body).data)

    @extend_schema(responses={200: QuotasSerializer})
    @action(detail=True, methods=["get"], serializer_class=QuotasSerializer, pagination_class=None)
    def quotas(self, request: Request, pk: str | None = None) -> Response:
        """The workspace's quotas: each limit (null: unlimited) and what is in use against it (any member)."""
        return self._quotas(self.get_object())

    @extend_schema(request=QuotaLimitsSerializer, responses={200: QuotasSerializer})
    @quotas.mapping.patch
    def set_quotas(self, request: Request, pk: str | None = None) -> Response:
        """Change some limits (the Owner only; null: unlimited). Lowering one below use stops nothing: it
        refuses new work. Audited."""
        workspace = self.get_object()
        limits = validated(QuotaLimitsSerializer, request.data)
        services.workspace_quota_set(actor=request.user, workspace=workspace, limits=limits)
        return self._quotas(workspace)

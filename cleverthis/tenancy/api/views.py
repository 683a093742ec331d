"""Read-only API for the caller's workspaces and their members."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from cleverthis.tenancy.api.serializers import MembershipSerializer, WorkspaceSerializer
from cleverthis.tenancy.mixins import WorkspaceScopedMixin
from cleverthis.tenancy.models import Membership, Workspace


class WorkspaceViewSet(WorkspaceScopedMixin, viewsets.ReadOnlyModelViewSet):
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

"""Ray API: clusters (create, inspect, change bounds, start, stop, delete), their nodes and events.

Views are thin: serializers parse, services decide. Service errors map to HTTP: ValidationError → 400
with field messages, PermissionDenied → 403 (Owners/Admins only write), IllegalTransition → 409; rows of
other workspaces are 404 through `WorkspaceScopedMixin`.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import exceptions, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.models import ComputeCluster
from kernel.api import ServiceErrorsMixin, validated
from kernel.schema import PAGING, UUID, page_of, query
from raymgr import selectors, services
from raymgr.api import serializers as s
from raymgr.models import RayCluster, RayClusterStatus
from tenancy.mixins import WorkspaceScopedMixin


@extend_schema_view(
    list=extend_schema(
        parameters=[
            query("workspace", UUID, "Only this workspace's."),
            query("status", {"type": "string", "enum": RayClusterStatus.values}, "By state."),
        ]
    ),
    create=extend_schema(request=s.RayClusterCreateSerializer, responses={201: s.RayClusterSerializer}),
    partial_update=extend_schema(request=s.RayClusterUpdateSerializer, responses={200: s.RayClusterSerializer}),
    destroy=extend_schema(
        responses={
            204: OpenApiResponse(description="Deleted."),
            202: OpenApiResponse(s.RayClusterSerializer, description="Stopping first: deleted once stopped."),
        }
    ),
)
class RayClusterViewSet(ServiceErrorsMixin, WorkspaceScopedMixin, viewsets.ModelViewSet):
    """Ray clusters of the caller's workspaces (filter: ?workspace=, ?status=); writes for Owners/Admins."""

    serializer_class = s.RayClusterSerializer
    queryset = RayCluster.objects.all()
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_base_queryset(self) -> QuerySet[RayCluster]:
        rows = selectors.ray_cluster_base()
        if self.action == "list":
            params = self.request.query_params
            if params.get("workspace"):
                rows = rows.filter(workspace_id=_uuid_param(params["workspace"], "workspace"))
            if params.get("status"):
                if params["status"] not in RayClusterStatus.values:
                    raise exceptions.ValidationError(
                        {"status": [f"Choose one of {', '.join(RayClusterStatus.values)}."]}
                    )
                rows = rows.filter(status=params["status"])
        return rows

    def _read(self, cluster: RayCluster) -> dict[str, Any]:
        return s.RayClusterSerializer(self.get_queryset().get(pk=cluster.pk)).data

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = validated(s.RayClusterCreateSerializer, request.data)
        workspace = self.get_workspace_from_request(data.pop("workspace"))
        compute = ComputeCluster.objects.filter(pk=data.pop("compute_cluster"), workspace=workspace).first()
        if compute is None:
            raise exceptions.ValidationError({"compute_cluster": ["No such compute cluster in this workspace."]})
        cluster = services.ray_cluster_create(actor=request.user, workspace=workspace, compute_cluster=compute, **data)
        return Response(self._read(cluster), status=201)

    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        cluster = self.get_object()
        data = validated(s.RayClusterUpdateSerializer, request.data, partial=True)
        cluster = services.ray_cluster_update(actor=request.user, cluster=cluster, **data)
        return Response(self._read(cluster))

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self.partial_update(request, *args, **kwargs)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        remaining = services.ray_cluster_delete(actor=request.user, cluster=self.get_object())
        if remaining is None:
            return Response(status=204)
        return Response(self._read(remaining), status=202)

    @extend_schema(request=None, responses={200: s.RayClusterSerializer})
    @action(detail=True, methods=["post"])
    def start(self, request: Request, pk: str | None = None) -> Response:
        """stopped/failed → pending (head placed again, then workers up to min_workers); 409 while stopping."""
        return Response(self._read(services.ray_cluster_start(actor=request.user, cluster=self.get_object())))

    @extend_schema(request=None, responses={200: s.RayClusterSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        """→ stopping: every Ray node is stopped (running jobs are interrupted); stopped once they all have."""
        return Response(self._read(services.ray_cluster_stop(actor=request.user, cluster=self.get_object())))

    @extend_schema(
        parameters=[query("all", {"type": "string"}, "1: include stopped nodes (any other value: not).")],
        responses={200: s.RayNodeSerializer(many=True)},
    )
    @action(detail=True, methods=["get"], serializer_class=s.RayNodeSerializer, pagination_class=None)
    def nodes(self, request: Request, pk: str | None = None) -> Response:
        """Head and workers with usage (?all=1 includes stopped ones)."""
        cluster = self.get_object()
        rows = selectors.ray_node_list(cluster=cluster, include_stopped=request.query_params.get("all") == "1")
        return Response(s.RayNodeSerializer(rows, many=True).data)

    @extend_schema(parameters=PAGING, responses={200: page_of(s.RayClusterEventSerializer)})
    @action(detail=True, methods=["get"], serializer_class=s.RayClusterEventSerializer)
    def events(self, request: Request, pk: str | None = None) -> Response:
        """The cluster's event log (status changes, placement, autoscaler decisions), newest first."""
        page = self.paginate_queryset(selectors.ray_event_list(cluster=self.get_object()))
        return self.get_paginated_response(s.RayClusterEventSerializer(page, many=True).data)


def _uuid_param(value: str, field: str) -> uuid.UUID:
    """A UUID query parameter, or 400."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise exceptions.ValidationError({field: ["Must be a UUID."]}) from None

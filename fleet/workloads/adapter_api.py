"""REST API for LoRA adapters: /adapters/ (list, retrieve, create, DELETE) and POST /adapters/{id}/attach/ and
.../detach/ with `{"endpoint": <id>}` (Owner, Admin, Member; Viewers read). Every queryset is scoped to the
caller's workspaces (another workspace's adapter or endpoint is 404); service errors map to 400, 403, 409.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.workloads import services as workload_services
from fleet.workloads.models import Endpoint, EndpointAdapter, LoraAdapter
from kernel.api import ServiceErrorsMixin
from tenancy.mixins import WorkspaceScopedMixin
from tenancy.selectors import workspace_ids


class LoraAdapterSerializer(serializers.ModelSerializer):
    """A LoRA adapter of a workspace and the endpoints (ids) it is attached to."""

    endpoints = serializers.SerializerMethodField()

    class Meta:
        model = LoraAdapter
        fields = ["id", "workspace", "name", "model_id", "revision", "path", "endpoints", "created_at"]
        read_only_fields = fields

    def get_endpoints(self, obj: LoraAdapter) -> list[str]:
        return [str(link.endpoint_id) for link in obj.endpoint_links.all()]


class LoraAdapterCreateSerializer(serializers.Serializer):
    """Input of POST /adapters/: a Hub repository (`model_id`, `revision`) or an absolute `path` on the nodes."""

    workspace = serializers.UUIDField()
    name = serializers.CharField(max_length=64, help_text="What requests put in `model` to use the adapter.")
    model_id = serializers.CharField(max_length=200, required=False, default="", allow_blank=True)
    revision = serializers.CharField(max_length=200, required=False, default="main")
    path = serializers.CharField(max_length=1000, required=False, default="", allow_blank=True)


class AdapterAttachSerializer(serializers.Serializer):
    """Input of POST /adapters/{id}/attach/ and .../detach/."""

    endpoint = serializers.UUIDField()


class LoraAdapterViewSet(
    ServiceErrorsMixin,
    WorkspaceScopedMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """LoRA adapters of the caller's workspaces: list, retrieve, create, delete, attach to and detach from an
    endpoint (its running replicas load or unload it at once, without a restart)."""

    serializer_class = LoraAdapterSerializer
    queryset = LoraAdapter.objects.all()
    workspace_field = "workspace"

    def get_base_queryset(self) -> QuerySet[LoraAdapter]:
        links = Prefetch("endpoint_links", EndpointAdapter.objects.order_by("created_at", "pk"))
        return LoraAdapter.objects.prefetch_related(links).order_by("name", "pk")

    @extend_schema(request=LoraAdapterCreateSerializer, responses={201: LoraAdapterSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Add an adapter to a workspace (400 with field messages when it cannot be one)."""
        data = LoraAdapterCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        workspace = self.get_workspace_from_request(values.pop("workspace"))
        adapter = workload_services.lora_adapter_create(actor=request.user, workspace=workspace, **values)
        return Response(
            LoraAdapterSerializer(self.get_base_queryset().get(pk=adapter.pk)).data, status=status.HTTP_201_CREATED
        )

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        """Delete an adapter attached to no endpoint (409 while one uses it)."""
        workload_services.lora_adapter_delete(actor=request.user, adapter=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

    def _endpoint(self, request: Request, adapter: LoraAdapter) -> Endpoint:
        data = AdapterAttachSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        endpoint = (
            Endpoint.objects.select_related("cluster__workspace")
            .filter(pk=data.validated_data["endpoint"], cluster__workspace__in=workspace_ids(user=request.user))
            .first()
        )
        if endpoint is None:
            raise exceptions.NotFound("Endpoint not found.")
        return endpoint

    @extend_schema(request=AdapterAttachSerializer, responses={200: LoraAdapterSerializer})
    @action(detail=True, methods=["post"])
    def attach(self, request: Request, pk: str | None = None) -> Response:
        """Attach the adapter to an endpoint whose servers run with --enable-lora (409 otherwise)."""
        adapter = self.get_object()
        workload_services.endpoint_adapter_attach(
            actor=request.user, endpoint=self._endpoint(request, adapter), adapter=adapter
        )
        return Response(LoraAdapterSerializer(self.get_base_queryset().get(pk=adapter.pk)).data)

    @extend_schema(request=AdapterAttachSerializer, responses={200: LoraAdapterSerializer})
    @action(detail=True, methods=["post"])
    def detach(self, request: Request, pk: str | None = None) -> Response:
        """Detach the adapter from an endpoint: its running replicas unload it."""
        adapter = self.get_object()
        workload_services.endpoint_adapter_detach(
            actor=request.user, endpoint=self._endpoint(request, adapter), adapter=adapter
        )
        return Response(LoraAdapterSerializer(self.get_base_queryset().get(pk=adapter.pk)).data)

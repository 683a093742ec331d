"""REST API for workloads: /containers/, /models/ (model locations, + POST .../evict/), /catalog/ and
/model-caches/ (`catalog_api`), /endpoints/ (+ POST .../stop/,
.../update/ and .../update_revision/, GET .../events/), /endpoint-benchmarks/ (`benchmark_api`), /adapters/
(LoRA adapters: `adapter_api`).

Exported as `router` (a SimpleRouter, no API root view) for inclusion under /api/v1/. Every queryset
is scoped by `WorkspaceScopedMixin`, lists are filtered by the filtersets of `fleet.workloads.filters`;
service errors map to 400 (field messages), 403, 409.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Prefetch, QuerySet
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from fleet.api.views import FilteredMixin
from fleet.models import ComputeCluster, Node
from fleet.workloads import selectors
from fleet.workloads import services as workload_services
from fleet.workloads.adapter_api import LoraAdapterViewSet
from fleet.workloads.benchmark_api import EndpointBenchmarkViewSet
from fleet.workloads.catalog_api import CatalogViewSet, NodeCacheViewSet
from fleet.workloads.errors import error_help
from fleet.workloads.filters import CONTAINER_FILTERS, ENDPOINT_FILTERS, MODEL_LOCATION_FILTERS
from fleet.workloads.key_api import ApiKeyViewSet
from fleet.workloads.models import Container, Endpoint, EndpointReplica, NodeModel
from fleet.workloads.serializers import (
    ContainerSerializer,
    EndpointAdmissionSerializer,
    EndpointCreateSerializer,
    EndpointEventSerializer,
    EndpointLimitsSerializer,
    EndpointRevisionSerializer,
    EndpointSerializer,
    EndpointUpdateSerializer,
    ModelLocationSerializer,
)
from fleet.workloads.services import PlacementError
from kernel.api import ServiceErrorsMixin as BaseServiceErrorsMixin
from kernel.schema import PAGING, page_of
from tenancy.mixins import WorkspaceScopedMixin, require_editor, require_operator
from tenancy.selectors import workspace_ids

# --------------------------------------------------------------------------------------------------
# Views


class CommandRefSerializer(serializers.Serializer):
    """A command the request queued."""

    command = serializers.UUIDField()
    status = serializers.CharField()


class ServiceErrorsMixin(BaseServiceErrorsMixin):
    """The shared translation, plus placement refusals → 409 with `code` and `error_help`."""

    def translate_exception(self, exc: Exception) -> Exception | Response:
        if isinstance(exc, PlacementError):
            return Response(
                {"detail": str(exc), "code": exc.code, "error_help": error_help(exc.code)},
                status=status.HTTP_409_CONFLICT,
            )
        return super().translate_exception(exc)


class ContainerViewSet(ServiceErrorsMixin, FilteredMixin, WorkspaceScopedMixin, viewsets.ReadOnlyModelViewSet):
    """Containers in the caller's workspaces; filter with ?node=, ?cluster=, ?status=."""

    serializer_class = ContainerSerializer
    queryset = Container.objects.all()
    workspace_field = "cluster__workspace"
    filterset = CONTAINER_FILTERS

    def get_base_queryset(self) -> QuerySet[Container]:
        return Container.objects.select_related("node").order_by("node__name", "name", "created_at", "pk")


class ModelLocationViewSet(ServiceErrorsMixin, FilteredMixin, WorkspaceScopedMixin, viewsets.ReadOnlyModelViewSet):
    """Which models are cached on which node; filter with ?model_id=, ?node=, ?cluster=. POST .../evict/
    removes one from its node's cache (Owner/Admin; 409 while an endpoint serves from it)."""

    serializer_class = ModelLocationSerializer
    queryset = NodeModel.objects.all()
    workspace_field = "node__cluster__workspace"
    filterset = MODEL_LOCATION_FILTERS

    def get_base_queryset(self) -> QuerySet[NodeModel]:
        return NodeModel.objects.select_related("node", "node__cluster").order_by(
            "model_id", "revision", "node__name", "pk"
        )

    @extend_schema(request=None, responses={202: CommandRefSerializer})
    @action(detail=True, methods=["post"])
    def evict(self, request: Request, pk: str | None = None) -> Response:
        """Evict the snapshot from its node's cache: a model.evict command (its id in the answer)."""
        cached = self.get_object()
        command = workload_services.node_model_evict(actor=request.user, cached=cached)
        return Response({"command": command.pk, "status": command.status}, status=status.HTTP_202_ACCEPTED)


class EndpointViewSet(
    ServiceErrorsMixin,
    FilteredMixin,
    WorkspaceScopedMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Inference endpoints: list, retrieve, create and POST .../stop/ (Owner, Admin, Member), GET .../events/."""

    serializer_class = EndpointSerializer
    queryset = Endpoint.objects.all()
    workspace_field = "cluster__workspace"
    filterset = ENDPOINT_FILTERS

    def get_base_queryset(self) -> QuerySet[Endpoint]:
        replicas = Prefetch(
            "replicas", EndpointReplica.objects.select_related("node").order_by("created_at", "server_id")
        )
        return (
            Endpoint.objects.filter(selectors.key_endpoint_limit(user=self.request.user))
            .select_related("node", "created_by")
            .prefetch_related(replicas)
            .order_by("-created_at", "pk")
        )

    def get_serializer_class(self) -> type[serializers.Serializer]:
        return EndpointCreateSerializer if self.action == "create" else EndpointSerializer

    @extend_schema(
        request=EndpointCreateSerializer,
        responses={
            201: EndpointSerializer,
            409: OpenApiResponse(
                {"$ref": "#/components/schemas/Error"},
                description="No node can serve the model: `code` and `error_help` say why.",
            ),
        },
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Start an endpoint for a cached model; 409 with the reason when no node can serve it."""
        if selectors.key_is_endpoint_limited(user=request.user):
            raise exceptions.PermissionDenied("This API key is limited to chosen endpoints: it creates none.")
        data = EndpointCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        cluster = (
            ComputeCluster.objects.select_related("workspace")
            .filter(pk=values["cluster"], workspace__in=workspace_ids(user=request.user))
            .first()
        )
        if cluster is None:
            raise exceptions.NotFound("Cluster not found.")
        node = None
        if values.get("node"):
            node = Node.objects.filter(pk=values["node"], cluster=cluster).first()
            if node is None:
                raise exceptions.ValidationError({"node": "No such node in this cluster."})
        if values.get("ray_cluster"):
            # the Ray cluster named by the model's own relation: the fleet app does not import raymgr
            ray_clusters = Endpoint._meta.get_field("ray_cluster").related_model._default_manager
            values["ray_cluster"] = ray_clusters.filter(pk=values["ray_cluster"], compute_cluster=cluster).first()
            if values["ray_cluster"] is None:
                raise exceptions.ValidationError({"ray_cluster": "No such Ray cluster on this compute cluster."})
        limits = {name: values[name] for name in ("key_requests_per_min", "key_tokens_per_min")}
        with transaction.atomic():
            endpoint = self._create(request, cluster, node, values)
            if any(v is not None for v in limits.values()):
                workload_services.endpoint_set_key_limits(actor=request.user, endpoint=endpoint, **limits)
        endpoint = self.get_base_queryset().get(pk=endpoint.pk)
        return Response(EndpointSerializer(endpoint).data, status=status.HTTP_201_CREATED)

    def _create(self, request: Request, cluster: ComputeCluster, node: Node | None, values: dict[str, Any]) -> Endpoint:
        return workload_services.endpoint_create(
            actor=request.user,
            cluster=cluster,
            model_id=values["model_id"],
            revision=values["revision"],
            node=node,
            gpus=values["gpus"],
            min_vram_mb=values["min_vram_mb"],
            public=values["public"],
            min_replicas=values["min_replicas"],
            max_replicas=values["max_replicas"],
            target_requests_per_min=values["target_requests_per_min"],
            target_in_flight=values["target_in_flight"],
            target_tokens_per_s=values["target_tokens_per_s"],
            scale_cooldown_s=values["scale_cooldown_s"],
            idle_timeout_s=values["idle_timeout_s"],
            server_args=values["server_args"],
            routing_policy=values["routing_policy"],
            target_queued=values["target_queued"],
            max_concurrency=values["max_concurrency"],
            queue_max_depth=values["queue_max_depth"],
            queue_max_wait_s=values["queue_max_wait_s"],
            ray_cluster=values["ray_cluster"],
            pipeline_parallel=values["pipeline_parallel"],
            tensor_parallel=values["tensor_parallel"],
        )

    @extend_schema(request=EndpointAdmissionSerializer, responses={200: EndpointSerializer})
    @action(detail=True, methods=["post"])
    def admission(self, request: Request, pk: str | None = None) -> Response:
        """Set the requests in flight each replica takes and the bounds of the endpoint's wait queue (Owner/Admin;
        null: the default; a field left out is kept). Past the queue's depth or wait bound a request gets 429."""
        endpoint = self.get_object()
        require_operator(request.user, endpoint.cluster.workspace, what="change an endpoint's queue")
        data = EndpointAdmissionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = {name: getattr(endpoint, name) for name in ("max_concurrency", "queue_max_depth", "queue_max_wait_s")}
        values |= data.validated_data
        endpoint = workload_services.endpoint_set_admission(actor=request.user, endpoint=endpoint, **values)
        return Response(EndpointSerializer(self.get_base_queryset().get(pk=endpoint.pk)).data)

    @extend_schema(request=EndpointLimitsSerializer, responses={200: EndpointSerializer})
    @action(detail=True, methods=["post"])
    def limits(self, request: Request, pk: str | None = None) -> Response:
        """Set the requests and tokens a minute each API key (and each member calling without a key) may use
        on this endpoint (Owner/Admin; null: no limit; a field left out is kept)."""
        endpoint = self.get_object()
        require_operator(request.user, endpoint.cluster.workspace, what="change an endpoint's limits")
        data = EndpointLimitsSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = {name: getattr(endpoint, name) for name in ("key_requests_per_min", "key_tokens_per_min")}
        values |= data.validated_data
        endpoint = workload_services.endpoint_set_key_limits(actor=request.user, endpoint=endpoint, **values)
        return Response(EndpointSerializer(self.get_base_queryset().get(pk=endpoint.pk)).data)

    @extend_schema(parameters=PAGING, responses={200: page_of(EndpointEventSerializer)})
    @action(detail=True, methods=["get"], serializer_class=EndpointEventSerializer)
    def events(self, request: Request, pk: str | None = None) -> Response:
        """The endpoint's event log, newest first: its replicas' lives and the autoscaler's decisions, with why."""
        page = self.paginate_queryset(selectors.endpoint_event_list(endpoint=self.get_object()))
        return self.get_paginated_response(EndpointEventSerializer(page, many=True).data)

    @extend_schema(request=None, responses={200: EndpointSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        """Stop the endpoint (→ stopping until the agent confirms)."""
        endpoint = self.get_object()
        endpoint = workload_services.endpoint_stop(actor=request.user, endpoint=endpoint)
        return Response(EndpointSerializer(self.get_base_queryset().get(pk=endpoint.pk)).data)

    @extend_schema(request=EndpointUpdateSerializer, responses={200: EndpointSerializer})
    @action(detail=True, methods=["post"], url_path="update")
    def rolling_update(self, request: Request, pk: str | None = None) -> Response:
        """Roll the endpoint over to another model revision and/or other server arguments (what is left out
        stays): new replicas first, each old one leaves rotation once its replacement answers. A
        `routing_policy` takes effect at once, without a rolling update."""
        endpoint = self.get_object()
        require_editor(request.user, endpoint.cluster.workspace, what="update endpoints")  # 403 before 400
        data = EndpointUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        routing_policy = values.pop("routing_policy", None)
        if values:
            endpoint = workload_services.endpoint_update(actor=request.user, endpoint=endpoint, **values)
        if routing_policy is not None:
            endpoint = workload_services.endpoint_set_routing(
                actor=request.user, endpoint=endpoint, routing_policy=routing_policy
            )
        return Response(EndpointSerializer(self.get_base_queryset().get(pk=endpoint.pk)).data)

    @extend_schema(request=EndpointRevisionSerializer, responses={200: EndpointSerializer})
    @action(detail=True, methods=["post"])
    def update_revision(self, request: Request, pk: str | None = None) -> Response:
        """Roll the endpoint over to another model revision (as `update/` with a revision alone)."""
        endpoint = self.get_object()
        require_editor(request.user, endpoint.cluster.workspace, what="update endpoints")
        data = EndpointRevisionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        endpoint = workload_services.endpoint_update(
            actor=request.user, endpoint=endpoint, revision=data.validated_data["revision"]
        )
        return Response(EndpointSerializer(self.get_base_queryset().get(pk=endpoint.pk)).data)


router = SimpleRouter()
router.register("containers", ContainerViewSet, basename="container")
router.register("models", ModelLocationViewSet, basename="model-location")
router.register("endpoints", EndpointViewSet, basename="endpoint")
router.register("api-keys", ApiKeyViewSet, basename="api-key")
router.register("endpoint-benchmarks", EndpointBenchmarkViewSet, basename="endpoint-benchmark")
router.register("catalog", CatalogViewSet, basename="catalog-model")
router.register("model-caches", NodeCacheViewSet, basename="model-cache")
router.register("adapters", LoraAdapterViewSet, basename="lora-adapter")

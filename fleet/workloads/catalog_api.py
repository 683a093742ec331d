"""REST API of the model catalog and the nodes' model caches: /catalog/ (search, filter by what fits, each
model's fit on each node; private models: POST, DELETE) and /model-caches/ (per node: cached snapshots,
disk free, budget, downloads with bytes and rate; POST .../budget/). Evicting one snapshot is
POST /models/<id>/evict/ (`fleet.workloads.api`)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.models import Node
from fleet.workloads import catalog_fit, model_cache
from fleet.workloads import services as workload_services
from fleet.workloads.catalog import MAX_NAME
from fleet.workloads.models import CatalogModel
from kernel.api import ServiceErrorsMixin
from tenancy.mixins import WorkspaceScopedMixin
from tenancy.selectors import workspace_list


class NodeFitSerializer(serializers.Serializer):
    """Whether the model fits on one node, how (GPU tensor parallel or CPU) and with what margin."""

    node = serializers.UUIDField(source="node.pk")
    node_name = serializers.CharField(source="node.name")
    cluster = serializers.UUIDField(source="node.cluster_id")
    fits = serializers.BooleanField(source="fit.fits")
    device = serializers.CharField(source="fit.device")
    tensor_parallel = serializers.IntegerField(source="fit.tensor_parallel")
    needed_mb = serializers.IntegerField(source="fit.needed_mb")
    offered_mb = serializers.IntegerField(source="fit.offered_mb")
    reason = serializers.CharField(source="fit.reason")
    cached = serializers.BooleanField(help_text="The node holds the weights already (placement prefers it).")


class CatalogModelSerializer(serializers.ModelSerializer):
    """A catalog model; with the fit figures when listed."""

    curated = serializers.BooleanField(read_only=True)

    class Meta:
        model = CatalogModel
        fields = [
            "id",
            "workspace",
            "curated",
            "name",
            "model_id",
            "revision",
            "local_path",
            "description",
            "params_b",
            "context_length",
            "layers",
            "kv_heads",
            "head_dim",
            "attention_heads",
            "quantizations",
            "server_args",
            "tags",
            "catalog_version",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


class CatalogFitSerializer(serializers.Serializer):
    """One model at the asked context and batch: what it needs and each node's answer."""

    model = CatalogModelSerializer()
    quantization = serializers.CharField(source="quantization.name")
    repo = serializers.CharField(help_text="The repository of that quantization ('' for a local path).")
    context = serializers.IntegerField()
    batch = serializers.IntegerField()
    vram_mb = serializers.IntegerField(help_text="VRAM on one GPU (tensor parallel 1), MiB.")
    cpu_mb = serializers.IntegerField(help_text="Memory on a CPU node (float32), MiB.")
    nodes = NodeFitSerializer(many=True)


class CatalogCreateSerializer(serializers.Serializer):
    """A private model of a workspace: a Hub repository and revision, or a folder on the nodes, and its sizes."""

    workspace = serializers.UUIDField()
    name = serializers.CharField(max_length=MAX_NAME)
    model_id = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    revision = serializers.CharField(max_length=200, required=False, default="main")
    local_path = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="")
    description = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")
    params_b = serializers.FloatField(min_value=0.000001, max_value=2000)
    context_length = serializers.IntegerField(min_value=0, max_value=10_000_000, required=False)
    layers = serializers.IntegerField(min_value=0, max_value=1000, required=False)
    kv_heads = serializers.IntegerField(min_value=0, max_value=1000, required=False)
    head_dim = serializers.IntegerField(min_value=0, max_value=4096, required=False)
    attention_heads = serializers.IntegerField(min_value=0, max_value=1000, required=False)
    quantizations = serializers.ListField(child=serializers.DictField(), required=False, max_length=8)
    server_args = serializers.ListField(child=serializers.CharField(max_length=500), required=False, max_length=64)
    tags = serializers.ListField(child=serializers.CharField(max_length=32), required=False, max_length=16)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if not attrs.get("model_id") and not attrs.get("local_path"):
            raise serializers.ValidationError({"model_id": "A Hub repository id, or a local_path on the nodes."})
        return attrs


class FitQuerySerializer(serializers.Serializer):
    """The list's query: search, tag, what to size for, and whether only models that fit somewhere."""

    search = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    tag = serializers.CharField(max_length=32, required=False, allow_blank=True, default="")
    context = serializers.IntegerField(min_value=1, max_value=catalog_fit.MAX_CONTEXT, required=False)
    batch = serializers.IntegerField(min_value=1, max_value=catalog_fit.MAX_BATCH, required=False, default=1)
    quantization = serializers.CharField(max_length=32, required=False, allow_blank=True, default="")
    cluster = serializers.UUIDField(required=False)
    fits = serializers.BooleanField(required=False, default=False)


_QUERY = [
    OpenApiParameter("search", str, description="In the name, repository or description."),
    OpenApiParameter("tag", str),
    OpenApiParameter("context", int, description="Tokens per sequence (default: the model's server context)."),
    OpenApiParameter("batch", int, description="Sequences at once (default 1)."),
    OpenApiParameter("quantization", str, description="A variant's name (default: the first, full precision)."),
    OpenApiParameter("cluster", str, description="Only this cluster's nodes."),
    OpenApiParameter("fits", bool, description="Only models that fit on at least one node."),
]


class CatalogViewSet(ServiceErrorsMixin, mixins.RetrieveModelMixin, mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """The model catalog: curated models (every workspace) and the private models of the caller's workspaces.

    The list sizes each model at `context` x `batch` and says which of the caller's online nodes can hold it
    (tensor parallel over one node's free GPUs, or a CPU node's memory). Scoped by `catalog_fit.catalog_list`:
    another workspace's private model is 404.
    """

    serializer_class = CatalogModelSerializer

    def get_queryset(self) -> QuerySet[CatalogModel]:
        return catalog_fit.catalog_list(user=self.request.user)

    @extend_schema(parameters=_QUERY, responses={200: CatalogFitSerializer(many=True)})
    def list(self, request: Request) -> Response:
        """Models with what they need and where they fit; `fits=true` keeps those that fit somewhere."""
        query = FitQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        q = query.validated_data
        models = list(catalog_fit.catalog_list(user=request.user, search=q["search"], tag=q["tag"]))
        rows = catalog_fit.catalog_rows(
            user=request.user,
            models=models,
            context=q.get("context"),
            batch=q["batch"],
            quantization=q["quantization"] or None,
            cluster_id=q.get("cluster"),
        )
        if q["fits"]:
            rows = [r for r in rows if r.fitting]
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(CatalogFitSerializer(page, many=True).data)

    @extend_schema(request=CatalogCreateSerializer, responses={201: CatalogModelSerializer})
    def create(self, request: Request) -> Response:
        """Add a private model to a workspace (Owner/Admin)."""
        data = CatalogCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        workspace = workspace_list(user=request.user).filter(pk=values.pop("workspace")).first()
        if workspace is None:
            raise exceptions.NotFound("Workspace not found.")
        model = workload_services.catalog_private_create(actor=request.user, workspace=workspace, values=values)
        return Response(CatalogModelSerializer(model).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance: CatalogModel) -> None:
        workload_services.catalog_private_delete(actor=self.request.user, model=instance)


class CachedModelSerializer(serializers.Serializer):
    """One snapshot in a node's cache."""

    id = serializers.UUIDField(source="row.pk")
    model_id = serializers.CharField(source="row.model_id")
    revision = serializers.CharField(source="row.revision")
    size_bytes = serializers.IntegerField(source="row.size_bytes")
    last_used_at = serializers.DateTimeField(source="row.last_used_at", allow_null=True)
    serving = serializers.ListField(child=serializers.CharField(), help_text="Endpoint slugs serving from it.")


class DownloadSerializer(serializers.Serializer):
    """A model.download under way."""

    command = serializers.UUIDField(source="command.pk")
    model_id = serializers.CharField()
    status = serializers.CharField(source="command.status")
    bytes_done = serializers.IntegerField(allow_null=True)
    bytes_total = serializers.IntegerField(allow_null=True)
    bytes_per_s = serializers.IntegerField(allow_null=True)
    percent = serializers.FloatField(allow_null=True)


class NodeCacheSerializer(serializers.Serializer):
    """One node's model cache."""

    node = serializers.UUIDField(source="node.pk")
    node_name = serializers.CharField(source="node.name")
    cluster = serializers.UUIDField(source="node.cluster_id")
    used_bytes = serializers.IntegerField()
    disk_free_bytes = serializers.IntegerField()
    budget_mb = serializers.IntegerField(help_text="The budget set here (0: none).")
    reported_budget_bytes = serializers.IntegerField(help_text="The budget the agent applies now.")
    models = CachedModelSerializer(source="entries", many=True)
    downloads = DownloadSerializer(many=True)


class BudgetSerializer(serializers.Serializer):
    budget_mb = serializers.IntegerField(min_value=0, max_value=2**40)


class NodeCacheViewSet(ServiceErrorsMixin, WorkspaceScopedMixin, viewsets.GenericViewSet):
    """Nodes' model caches (by node id): what is cached, disk free, the budget, downloads with bytes and rate."""

    queryset = Node.objects.all()
    workspace_field = "cluster__workspace"
    serializer_class = NodeCacheSerializer

    def get_base_queryset(self) -> QuerySet[Node]:
        return Node.objects.order_by("name", "pk")

    @extend_schema(responses={200: NodeCacheSerializer(many=True)})
    def list(self, request: Request) -> Response:
        page = self.paginate_queryset(list(self.get_queryset()))
        return self.get_paginated_response(NodeCacheSerializer(model_cache.node_caches(page), many=True).data)

    def retrieve(self, request: Request, pk: Any = None) -> Response:
        (view,) = model_cache.node_caches([self.get_object()])
        return Response(NodeCacheSerializer(view).data)

    @extend_schema(request=BudgetSerializer, responses={200: NodeCacheSerializer})
    @action(detail=True, methods=["post"])
    def budget(self, request: Request, pk: Any = None) -> Response:
        """Set the node's cache budget in MiB (Owner/Admin; 0: none); the agent applies it at its next download,
        evicting the least recently used snapshots no endpoint serves from."""
        node = self.get_object()
        data = BudgetSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        workload_services.node_cache_set_budget(
            actor=request.user, node=node, budget_mb=data.validated_data["budget_mb"]
        )
        (view,) = model_cache.node_caches([node])
        return Response(NodeCacheSerializer(view).data)

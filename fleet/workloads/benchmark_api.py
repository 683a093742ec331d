"""REST API for endpoint benchmarks: /endpoint-benchmarks/ (list, filter `?endpoint=`, retrieve, create) and
GET /endpoint-benchmarks/<id>/export/?as=csv|json (the report to download).

Any member of the endpoint's workspace reads reports; Owners and Admins start runs (403 for others, before any
400 for bad settings); 409 while the endpoint is not running or another run of it is under way.
"""

from __future__ import annotations

import io
import json
from typing import Any

from django.db.models import QuerySet
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.workloads import selectors
from fleet.workloads.loadgen import FIGURES
from fleet.workloads.models import Endpoint, EndpointBenchmark
from fleet.workloads.services import benchmarks
from kernel.api import ServiceErrorsMixin
from kernel.csv_export import SafeWriter
from tenancy.mixins import WorkspaceScopedMixin, require_operator

SETTINGS = ("concurrency", "prompt_tokens", "output_tokens", "duration_s", "turns")


class EndpointBenchmarkSerializer(serializers.ModelSerializer):
    """A benchmark: its settings, the endpoint's revision, server arguments and routing policy at the time, its
    progress (`requests_done`) and, once it succeeded, its report (figures, errors by kind, per-second series)."""

    class Meta:
        model = EndpointBenchmark
        fields = [
            "id",
            "endpoint",
            "status",
            *SETTINGS,
            "revision",
            "server_args",
            "routing_policy",
            "requests_done",
            "report",
            "failure_message",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


def _setting(name: str, help_text: str, default: int | None = None) -> serializers.IntegerField:
    least, most = benchmarks.LIMITS[name]
    extra: dict[str, Any] = {"required": default is None} | ({"default": default} if default is not None else {})
    return serializers.IntegerField(min_value=least, max_value=most, help_text=help_text, **extra)


class EndpointBenchmarkCreateSerializer(serializers.Serializer):
    """What to run: `concurrency` clients sending streamed chat completions back to back for `duration_s`, each
    prompt about `prompt_tokens` words, asking `output_tokens` tokens; `turns` > 1: conversations of that many
    turns, each resending its history."""

    endpoint = serializers.UUIDField()
    concurrency = _setting("concurrency", "Clients sending at once.")
    prompt_tokens = _setting("prompt_tokens", "Words per prompt (about one token each).")
    output_tokens = _setting("output_tokens", "Tokens asked for per answer.")
    duration_s = _setting("duration_s", "How long the load runs (s).")
    turns = _setting("turns", "Turns per conversation (1: single requests).", default=1)


class EndpointBenchmarkViewSet(
    ServiceErrorsMixin,
    WorkspaceScopedMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """Benchmarks of the endpoints of the caller's workspaces, newest first."""

    serializer_class = EndpointBenchmarkSerializer
    queryset = EndpointBenchmark.objects.all()
    workspace_field = "endpoint__cluster__workspace"

    def get_base_queryset(self) -> QuerySet[EndpointBenchmark]:
        rows = EndpointBenchmark.objects.filter(
            endpoint__in=Endpoint.objects.filter(selectors.key_endpoint_limit(user=self.request.user))
        ).order_by("-created_at", "pk")
        endpoint = self.request.query_params.get("endpoint") if self.action == "list" else None
        if endpoint:
            try:
                serializers.UUIDField().to_internal_value(endpoint)
            except serializers.ValidationError:
                raise exceptions.ValidationError({"endpoint": "Not a valid endpoint id."}) from None
            rows = rows.filter(endpoint_id=endpoint)
        return rows

    @extend_schema(
        parameters=[OpenApiParameter("endpoint", OpenApiTypes.UUID, description="Only this endpoint's benchmarks.")]
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Benchmarks, newest first (paged)."""
        return super().list(request, *args, **kwargs)

    @extend_schema(request=EndpointBenchmarkCreateSerializer, responses={201: EndpointBenchmarkSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Start a benchmark of an endpoint (Owner/Admin): a Celery worker sends the load through its URL."""
        endpoint_id = request.data.get("endpoint") if isinstance(request.data, dict) else None
        if not endpoint_id:
            raise exceptions.ValidationError({"endpoint": "This field is required."})
        try:
            endpoint_id = serializers.UUIDField().to_internal_value(endpoint_id)
        except serializers.ValidationError:
            raise exceptions.ValidationError({"endpoint": "Not a valid endpoint id."}) from None
        endpoint = (
            selectors.endpoint_list(user=request.user)
            .select_related("cluster__workspace")
            .filter(pk=endpoint_id)
            .first()
        )
        if endpoint is None:
            raise exceptions.NotFound("Endpoint not found.")
        require_operator(request.user, endpoint.cluster.workspace, what="benchmark endpoints")  # 403 before 400
        data = EndpointBenchmarkCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = {name: data.validated_data[name] for name in SETTINGS}
        benchmark = benchmarks.benchmark_create(actor=request.user, endpoint=endpoint, **values)
        return Response(EndpointBenchmarkSerializer(benchmark).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        parameters=[OpenApiParameter("as", OpenApiTypes.STR, enum=["json", "csv"], description="json by default")],
        responses={200: OpenApiResponse(OpenApiTypes.BINARY, description="The report as a download.")},
    )
    @action(detail=True, methods=["get"])
    def export(self, request: Request, pk: str | None = None) -> HttpResponse:
        """The benchmark as a file: JSON (everything) or CSV (settings and figures, one per line)."""
        benchmark = self.get_object()
        kind = request.query_params.get("as", "json")
        if kind not in ("json", "csv"):
            raise exceptions.ValidationError({"as": "Choose json or csv."})
        return export_response(benchmark, kind)


def csv_text(benchmark: EndpointBenchmark) -> str:
    """Settings and figures, one `name,value` line each, then the per-second series."""
    out = io.StringIO()
    writer = SafeWriter(out)
    writer.writerow(["name", "value"])
    for name in ("endpoint", "revision", "routing_policy", *SETTINGS, "status"):
        writer.writerow([name, getattr(benchmark, f"{name}_id" if name == "endpoint" else name)])
    writer.writerow(["server_args", " ".join(benchmark.server_args)])
    for name in FIGURES:
        writer.writerow([name, benchmark.report.get(name, "")])
    per_second = benchmark.report.get("per_second") or {}
    if per_second:
        writer.writerow([])
        names = list(per_second)
        writer.writerow(["second", *names])
        for second, values in enumerate(zip(*(per_second[n] for n in names), strict=True)):
            writer.writerow([second, *("" if v is None else v for v in values)])
    return out.getvalue()


def export_response(benchmark: EndpointBenchmark, kind: str) -> HttpResponse:
    """The download for `kind` (json or csv)."""
    name = f"benchmark-{benchmark.endpoint.slug}-{str(benchmark.pk)[:8]}.{kind}"
    if kind == "csv":
        response = HttpResponse(csv_text(benchmark), content_type="text/csv; charset=utf-8")
    else:
        document = json.dumps(EndpointBenchmarkSerializer(benchmark).data, indent=2, default=str)
        response = HttpResponse(document, content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response

"""Audit API: GET /api/v1/audit/ (filters, paging; `?format=csv|json` exports every match) and one entry.

Scoped by `WorkspaceScopedMixin` like every API: entries of other workspaces are never listed and 404.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import exceptions, serializers, viewsets
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from audit.models import AuditEntry
from audit.selectors import AUDIT_FILTERS, audit_entry_list
from kernel.api import ServiceErrorsMixin
from kernel.csv_export import SafeWriter
from tenancy.mixins import WorkspaceScopedMixin

EXPORT_FORMATS = ("csv", "json")
CSV_COLUMNS = [
    "id",
    "created_at",
    "workspace",
    "actor",
    "action",
    "target_type",
    "target_id",
    "target_name",
    "outcome",
    "reason",
    "git_commit",
    "finished_at",
    "detail",
]


class AuditEntrySerializer(serializers.ModelSerializer):
    """One operator action: who (`actor`), what (`action`), on which target, when, and how it ended.

    `outcome`: ok, refused (with `reason`), pending (commands it sent are still running) or failed (one
    of them failed; `reason` says how). `git_commit`: the commit an argocd-mode deploy pushed.
    """

    actor = serializers.CharField(source="actor_name")

    class Meta:
        model = AuditEntry
        fields = [
            "id",
            "created_at",
            "workspace",
            "actor",
            "action",
            "target_type",
            "target_id",
            "target_name",
            "outcome",
            "reason",
            "detail",
            "git_commit",
            "finished_at",
        ]
        read_only_fields = fields


def _row(entry: AuditEntry) -> dict[str, Any]:
    return AuditEntrySerializer(entry).data


def _csv_lines(rows: Iterator[AuditEntry]) -> Iterator[str]:
    buffer = io.StringIO()
    writer = SafeWriter(buffer)

    def flush() -> str:
        text = buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
        return text

    writer.writerow(CSV_COLUMNS)
    yield flush()
    for entry in rows:
        data = _row(entry)
        data["detail"] = json.dumps(data["detail"], sort_keys=True)
        writer.writerow([data[c] for c in CSV_COLUMNS])
        yield flush()


def _json_lines(count: int, rows: Iterator[AuditEntry]) -> Iterator[str]:
    """The shape of a page (`count`, `next`, `previous`, `results`) holding every row."""
    yield json.dumps({"count": count, "next": None, "previous": None})[:-1] + ', "results": ['
    for i, entry in enumerate(rows):
        yield ("," if i else "") + json.dumps(_row(entry), cls=DjangoJSONEncoder)
    yield "]}\n"


def export_response(queryset: QuerySet[AuditEntry], fmt: str) -> StreamingHttpResponse:
    """Every entry of `queryset` as a CSV or JSON download, streamed in chunks of rows; the JSON has
    the shape of one page of the list holding them all."""
    rows = queryset.iterator(chunk_size=500)
    lines = _csv_lines(rows) if fmt == "csv" else _json_lines(queryset.count(), rows)
    content_type = "text/csv; charset=utf-8" if fmt == "csv" else "application/json"
    response = StreamingHttpResponse(lines, content_type=content_type)
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    response["Content-Disposition"] = f'attachment; filename="audit-{stamp}.{fmt}"'
    return response


_FORMAT = OpenApiParameter(
    "format",
    {"type": "string", "enum": list(EXPORT_FORMATS)},
    required=False,
    description="Export every matching entry (no paging) as a CSV or JSON download.",
)


@extend_schema_view(
    list=extend_schema(
        parameters=[_FORMAT],
        responses={
            200: OpenApiResponse(
                AuditEntrySerializer(many=True),
                description="A page of entries, newest first; with `format=json` one page holding every match.",
            ),
            (200, "text/csv"): OpenApiResponse(OpenApiTypes.STR, description="With `format=csv`: every match."),
        },
    ),
)
class AuditEntryViewSet(ServiceErrorsMixin, WorkspaceScopedMixin, viewsets.ReadOnlyModelViewSet):
    """The audit trail of the caller's workspaces (filters: workspace, actor, action, target_type,
    target_id, outcome, since, until)."""

    serializer_class = AuditEntrySerializer
    queryset = AuditEntry.objects.all()
    filterset = AUDIT_FILTERS

    def get_base_queryset(self) -> QuerySet[AuditEntry]:
        return AuditEntry.objects.order_by("-created_at", "-id")

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        """`format` names an export here, not a renderer: answers other than the export are JSON."""
        fmt = request.query_params.get("format")
        if fmt is None:
            return super().perform_content_negotiation(request, force)
        if fmt not in EXPORT_FORMATS:
            # rendered as JSON (the negotiation is what failed)
            request.accepted_renderer, request.accepted_media_type = JSONRenderer(), JSONRenderer.media_type
            raise exceptions.ValidationError({"format": f"Choose one of {', '.join(EXPORT_FORMATS)}."})
        return JSONRenderer(), JSONRenderer.media_type

    def list(self, request: Request, *args: Any, **kwargs: Any) -> Any:
        rows = AUDIT_FILTERS.apply(audit_entry_list(user=request.user), request.query_params)
        fmt = request.query_params.get("format")
        if fmt in EXPORT_FORMATS:
            return export_response(rows, fmt)
        page = self.paginate_queryset(rows)
        return self.get_paginated_response(AuditEntrySerializer(page, many=True).data)

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response(AuditEntrySerializer(self.get_object()).data)


router = SimpleRouter()
router.register("audit", AuditEntryViewSet, basename="audit-entry")

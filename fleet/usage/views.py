"""The Usage page (htmx: the filters swap the report in place; it refreshes every minute) and its CSV export."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from typing import Any
from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render

from fleet.usage import chargeback, costing, flush_notes, selectors
from fleet.usage.api import UsageQuerySerializer, usage_report
from kernel.csv_export import SafeWriter
from tenancy.selectors import workspace_list

CSV_COLUMNS = (
    "bucket_start",
    "granularity",
    "workspace_id",
    "subject_kind",
    "subject_id",
    "api_key_id",
    "requests",
    "errors",
    "rate_limited",
    "prompt_tokens",
    "completion_tokens",
    "latency_ms_sum",
    "latency_ms_max",
    "node_seconds",
    "gpu_seconds",
    "container_seconds",
    "cpu_core_seconds",
    "memory_mib_seconds",
)
COST_COLUMNS = ("cost", "currency")  # the row at the prices in force at its bucket's start


def _params(request: HttpRequest) -> UsageQuerySerializer:
    given = {k: v for k, v in request.GET.items() if v != ""}
    params = UsageQuerySerializer(data=given, context={"user": request.user})
    params.is_valid()
    return params


def _chart(key: str, title: str, series: dict[str, list[float]], labels: dict[str, str], unit: str = "") -> dict:
    """One chart `static/js/charts.js` draws, with its summary as the text alternative."""
    totals = ", ".join(f"{labels[n]} {sum(v for v in values if v):g}{unit}" for n, values in series.items())
    spec = {"series": series, "labels": labels, "unit": unit, "max": None, "window": "period"}
    return {"key": key, "title": title, "spec": json.dumps(spec), "summary": f"In the period: {totals}."}


def _charts(report: dict[str, Any]) -> list[dict]:
    series = report["series"]

    # minute buckets hold at most a minute of each node: drawn in minutes, hour buckets in hours
    unit, scale = ("minute", 60.0) if report["granularity"] == "minute" else ("hour", 3600.0)

    def measure(name: str, scale: float = 1.0) -> list[float]:
        return [round((b[name] or 0) / scale, 3) for b in series]

    return [
        _chart(
            "requests",
            f"Requests per {report['granularity']}",
            {"requests": measure("requests"), "errors": measure("errors")},
            {"requests": "Requests", "errors": "Errors"},
        ),
        _chart(
            "tokens",
            f"Tokens per {report['granularity']}",
            {"prompt": measure("prompt_tokens"), "completion": measure("completion_tokens")},
            {"prompt": "Prompt tokens", "completion": "Completion tokens"},
        ),
        _chart(
            "hours",
            f"Node, GPU and container {unit}s per {report['granularity']}",
            {
                "nodes": measure("node_seconds", scale),
                "gpu": measure("gpu_seconds", scale),
                "containers": measure("container_seconds", scale),
            },
            {"nodes": f"Node-{unit}s", "gpu": f"GPU-{unit}s", "containers": f"Container-{unit}s"},
            unit=" min" if unit == "minute" else " h",
        ),
    ]


@login_required
def usage_page(request: HttpRequest) -> HttpResponse:
    """Usage of the user's workspaces over a period, filtered by workspace, endpoint or API key."""
    params = _params(request)
    context: dict[str, Any] = {
        "periods": [(key, label) for key, (label, _, _) in selectors.PERIODS.items()],
        "workspaces": workspace_list(user=request.user).order_by("name"),
        "endpoints": selectors.usage_endpoints(user=request.user).select_related("cluster"),
        "api_keys": selectors.usage_api_keys(user=request.user),
        "filters": {k: v for k, v in request.GET.items() if v != ""},
        "errors": params.errors,
        "query_string": request.GET.urlencode(),
        "budget_alerts": selectors.budget_alerts(user=request.user),
        "flush_failures": [
            {**note, "at": datetime.fromtimestamp(note["at"], UTC)} for note in flush_notes.flush_failures()
        ],
    }
    status = 400 if params.errors else 200
    if not params.errors:
        report = usage_report(user=request.user, query=params.query())
        context |= {"report": report, "charts": _charts(report), "period_label": selectors.PERIODS[report["period"]][0]}
    template = "usage/_report.html" if request.htmx else "usage/usage.html"
    return render(request, template, context, status=status)


class _Echo:
    def write(self, value: str) -> str:
        return value


@login_required
def usage_csv(request: HttpRequest) -> HttpResponse:
    """Every rollup of the period and filters, one CSV line each (streamed)."""
    params = _params(request)
    if params.errors:
        lines = [f"{field}: {' '.join(str(m) for m in messages)}" for field, messages in params.errors.items()]
        return HttpResponse("\n".join(lines) + "\n", status=400, content_type="text/plain; charset=utf-8")
    query = params.query()
    rows = selectors.usage_export_rows(rows=selectors.usage_rollups(user=request.user, query=query))
    writer = SafeWriter(_Echo())
    versions = selectors.price_versions()

    def lines():
        yield writer.writerow((*CSV_COLUMNS, *COST_COLUMNS))
        for row in rows.values(*CSV_COLUMNS, "gpu_seconds_by_model").iterator(chunk_size=2000):
            prices = costing.in_force(versions, row["bucket_start"])
            cost = [costing.row_cost(row, versions), prices.currency] if prices else ["", ""]
            values = [row[c] for c in CSV_COLUMNS] + cost
            yield writer.writerow([v.isoformat() if hasattr(v, "isoformat") else v for v in values])

    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="usage-{query.period}.csv"'
    return response


def _statement_params(request: HttpRequest) -> tuple[Any, date | None, dict[str, str]]:
    """(the workspace, the month, field errors) of a chargeback request; the user's first workspace and
    the current month by default."""
    errors: dict[str, str] = {}
    workspaces = workspace_list(user=request.user).order_by("name")
    wanted = request.GET.get("workspace", "")
    workspace = workspaces.filter(pk=wanted).first() if _is_uuid(wanted) else None
    if wanted and workspace is None:
        errors["workspace"] = "No such workspace."
    workspace = workspace or (None if wanted else workspaces.first())
    month_text = request.GET.get("month") or datetime.now(UTC).strftime("%Y-%m")
    try:
        month = datetime.strptime(month_text, "%Y-%m").date()
    except ValueError:
        errors["month"] = "A month as YYYY-MM."
        month = None
    return workspace, month, errors


def _is_uuid(text: str) -> bool:
    try:
        UUID(text)
    except ValueError:
        return False
    return True


@login_required
def chargeback_page(request: HttpRequest) -> HttpResponse:
    """A workspace's monthly chargeback statement: its usage of the month costed at the prices then in force."""
    workspace, month, errors = _statement_params(request)
    context: dict[str, Any] = {
        "workspaces": workspace_list(user=request.user).order_by("name"),
        "errors": errors,
        "workspace": workspace,
        "month": month,
        "query_string": request.GET.urlencode(),
    }
    if workspace is not None and month is not None and not errors:
        context["statement"] = chargeback.chargeback_statement(workspace=workspace, month=month)
        context["budgets"] = selectors.budget_list(user=request.user).filter(workspace=workspace).order_by("pk")
    return render(request, "usage/chargeback.html", context, status=400 if errors else 200)


@login_required
def chargeback_csv(request: HttpRequest) -> HttpResponse:
    """The statement as CSV: one line per subject, item and unit price, the total last."""
    workspace, month, errors = _statement_params(request)
    if errors or workspace is None or month is None:
        lines = [f"{field}: {message}" for field, message in errors.items()] or ["workspace: No workspace."]
        return HttpResponse("\n".join(lines) + "\n", status=400, content_type="text/plain; charset=utf-8")
    statement = chargeback.chargeback_statement(workspace=workspace, month=month)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    writer = SafeWriter(response)
    writer.writerow(chargeback.CSV_COLUMNS)
    for row in chargeback.csv_rows(statement, workspace.name):
        writer.writerow(row)
    response["Content-Disposition"] = f'attachment; filename="chargeback-{workspace.slug}-{statement.label}.csv"'
    return response

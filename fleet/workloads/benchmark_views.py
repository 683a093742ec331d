"""Endpoint benchmark pages: the Benchmark form and the list of runs on the endpoint's page (its own partial,
polled while a run is under way, so progress shows without a reload), one report with its charts, two reports
side by side (`?compare=<id>`), and the CSV/JSON downloads."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from fleet.workloads import selectors
from fleet.workloads.benchmark_api import export_response
from fleet.workloads.loadgen import FIGURES
from fleet.workloads.models import EndpointBenchmark
from fleet.workloads.services import benchmarks
from kernel.exceptions import IllegalTransition
from tenancy.permissions import can_operate

BENCHMARKS_SHOWN = 20
LABELS = {
    "requests": "Requests",
    "succeeded": "Succeeded",
    "errors": "Errors",
    "rate_limited": "Refused (429)",
    "server_errors": "Server errors (5xx)",
    "ttft_ms_p50": "TTFT p50 (ms)",
    "ttft_ms_p99": "TTFT p99 (ms)",
    "itl_ms_p50": "Inter-token p50 (ms)",
    "itl_ms_p99": "Inter-token p99 (ms)",
    "latency_ms_p50": "Latency p50 (ms)",
    "latency_ms_p99": "Latency p99 (ms)",
    "prompt_tokens_mean": "Prompt tokens (mean)",
    "output_tokens": "Output tokens",
    "output_tokens_per_s": "Output tokens/s",
    "requests_per_s": "Requests/s",
    "duration_s": "Duration (s)",
}


def _field(name: str, label: str, initial: int) -> forms.IntegerField:
    least, most = benchmarks.LIMITS[name]
    return forms.IntegerField(min_value=least, max_value=most, initial=initial, label=label)


class BenchmarkForm(forms.Form):
    """The Benchmark button's settings (bounds: `services.benchmarks.LIMITS`)."""

    concurrency = _field("concurrency", "Concurrent clients", 4)
    prompt_tokens = _field("prompt_tokens", "Prompt length (words ≈ tokens)", 128)
    output_tokens = _field("output_tokens", "Output tokens", 64)
    duration_s = _field("duration_s", "Duration (s)", 30)
    turns = _field("turns", "Turns per conversation (1: single requests)", 1)


def _endpoint(request: HttpRequest, pk: Any) -> Any:
    return get_object_or_404(selectors.endpoint_list(user=request.user).select_related("cluster__workspace"), pk=pk)


def panel_context(endpoint: Any) -> dict[str, Any]:
    """What the endpoint page needs to include the Benchmarks panel."""
    runs = list(EndpointBenchmark.objects.filter(endpoint=endpoint).order_by("-created_at")[:BENCHMARKS_SHOWN])
    return {
        "benchmarks": runs,
        "benchmarks_polling": any(r.in_progress for r in runs),
        "benchmark_form": BenchmarkForm(),
    }


def _panel(request: HttpRequest, endpoint: Any, form: BenchmarkForm | None = None, status: int = 200) -> HttpResponse:
    shown = panel_context(endpoint)
    polling = shown["benchmarks_polling"]
    context = {
        "endpoint": endpoint,
        "runs": shown["benchmarks"],
        "polling": polling,
        "can_operate": can_operate(request.user, endpoint.cluster.workspace),
        "form": form or shown["benchmark_form"],
    }
    response = render(request, "workloads/_endpoint_benchmarks.html", context, status=status)
    if request.htmx and request.method == "GET" and not polling:
        response.status_code = 286  # htmx stops polling
    return response


@login_required
def endpoint_benchmarks(request: HttpRequest, pk: Any) -> HttpResponse:
    """The endpoint page's Benchmarks panel alone (polled while a run is queued or running)."""
    return _panel(request, _endpoint(request, pk))


@login_required
@require_POST
def endpoint_benchmark_start(request: HttpRequest, pk: Any) -> HttpResponse:
    """Start a benchmark (Owner/Admin); the panel again, with the new run or (400/409) what was wrong."""
    endpoint = _endpoint(request, pk)
    if not can_operate(request.user, endpoint.cluster.workspace):
        raise PermissionDenied("Only workspace Owners and Admins can benchmark endpoints.")
    form = BenchmarkForm(request.POST)
    if not form.is_valid():
        return _panel(request, endpoint, form, status=400)
    try:
        benchmarks.benchmark_create(actor=request.user, endpoint=endpoint, **form.cleaned_data)
    except ValidationError as exc:
        for name, messages in exc.message_dict.items():
            form.add_error(name if name in form.fields else None, messages)
        return _panel(request, endpoint, form, status=400)
    except IllegalTransition as exc:
        form.add_error(None, str(exc))
        return _panel(request, endpoint, form, status=409)
    if not request.htmx:  # a plain form post (no JavaScript): back to the endpoint's page
        return redirect("workloads:endpoint_detail", pk=endpoint.pk)
    return _panel(request, endpoint)


def _chart(key: str, title: str, series: dict[str, list], labels: dict[str, str], unit: str) -> dict[str, Any]:
    spec = {"series": series, "labels": labels, "unit": unit, "max": None, "window": "run (seconds)"}
    summary = "; ".join(
        f"{labels[n]}: peak {max((v for v in values if v is not None), default=0):g}{unit}"
        for n, values in series.items()
    )
    return {"key": key, "title": title, "spec": json.dumps(spec), "summary": summary}


def _charts(runs: list[EndpointBenchmark]) -> list[dict[str, Any]]:
    """Per second of each run: output tokens, requests finished, TTFT p50 (one series per run)."""
    names = ["mean", "max"]  # two styles of static/js/charts.js that tell two runs apart without colour
    charts = []
    for key, title, unit in (
        ("output_tokens", "Output tokens per second", ""),
        ("requests", "Requests finished per second", ""),
        ("ttft_ms_p50", "TTFT p50 per second", " ms"),
    ):
        series = {names[i]: (r.report.get("per_second") or {}).get(key, []) for i, r in enumerate(runs)}
        labels = {names[i]: f"run {str(r.pk)[:8]}" for i, r in enumerate(runs)}
        charts.append(_chart(key, title, series, labels, unit))
    return charts


def _report(request: HttpRequest, endpoint: Any, runs: list[EndpointBenchmark]) -> HttpResponse:
    rows = []
    for name in FIGURES:
        values = [r.report.get(name) for r in runs]
        ratio = None
        if len(values) == 2 and all(isinstance(v, int | float) for v in values) and values[0]:
            ratio = values[1] / values[0]
        rows.append({"name": name, "label": LABELS[name], "values": values, "ratio": ratio})
    context = {
        "endpoint": endpoint,
        "runs": runs,
        "rows": rows,
        "charts": _charts(runs),
        "others": EndpointBenchmark.objects.filter(endpoint=endpoint, status="succeeded").exclude(pk=runs[0].pk)[:50],
    }
    return render(request, "workloads/endpoint_benchmark.html", context)


@login_required
def benchmark_detail(request: HttpRequest, pk: Any, benchmark: Any) -> HttpResponse:
    """One report with its charts (any member of the workspace)."""
    endpoint = _endpoint(request, pk)
    return _report(request, endpoint, [get_object_or_404(EndpointBenchmark, pk=benchmark, endpoint=endpoint)])


@login_required
def benchmark_compare(request: HttpRequest, pk: Any) -> HttpResponse:
    """Two runs of the endpoint side by side (`?a=<id>&b=<id>`), with second / first per figure; 400 without two."""
    endpoint = _endpoint(request, pk)
    runs = []
    for name in ("a", "b"):
        try:
            runs.append(EndpointBenchmark.objects.get(pk=request.GET.get(name), endpoint=endpoint))
        except (EndpointBenchmark.DoesNotExist, ValidationError, ValueError):
            return HttpResponse(
                f"{name}: pick two benchmarks of this endpoint.", status=400, content_type="text/plain; charset=utf-8"
            )
    return _report(request, endpoint, runs)


@login_required
def benchmark_export(request: HttpRequest, pk: Any, benchmark: Any, kind: str) -> HttpResponse:
    """The report as CSV or JSON (any member of the workspace)."""
    endpoint = _endpoint(request, pk)
    run = get_object_or_404(EndpointBenchmark, pk=benchmark, endpoint=endpoint)
    if kind not in ("csv", "json"):
        return HttpResponse("Choose csv or json.", status=400, content_type="text/plain")
    return export_response(run, kind)

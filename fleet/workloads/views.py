"""Endpoint pages: every inference endpoint of the user's workspaces, overall and per cluster, with its
replicas (node, state, requests in flight through this web process), start/stop and a rolling update
(revision, server arguments) for Owners and Admins (htmx: the table alone, polled while an endpoint or one
of its replicas is on its way)."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from cleverthis.tenancy.permissions import can_operate
from cleverthis.tenancy.selectors import workspace_ids
from fleet.models import ComputeCluster
from fleet.workloads import selectors
from fleet.workloads import services as workload_services
from fleet.workloads.errors import error_help
from fleet.workloads.forms import EndpointUpdateForm, server_args_line
from fleet.workloads.models import Endpoint, EndpointStatus
from fleet.workloads.services import PlacementError
from kernel import balancer
from kernel.exceptions import IllegalTransition

IN_FLIGHT = frozenset({EndpointStatus.PENDING, EndpointStatus.STARTING, EndpointStatus.STOPPING})


def _rows(request: HttpRequest, endpoints: list[Endpoint]) -> list[dict[str, Any]]:
    operable: dict[Any, bool] = {}
    rows = []
    for endpoint in endpoints:
        workspace = endpoint.cluster.workspace
        if workspace.pk not in operable:
            operable[workspace.pk] = can_operate(request.user, workspace)
        start = endpoint.start_command
        rows.append(
            {
                "endpoint": endpoint,
                "can_operate": operable[workspace.pk],
                "log_tail": endpoint.failure_message or ((start.result or {}).get("log_tail", "") if start else ""),
                "error_help": error_help(endpoint.failure_code),
                "replicas": [(r, balancer.outstanding(r.server_id)) for r in endpoint.replicas.all()],
                "server_args": server_args_line(endpoint.server_args),
            }
        )
    return rows


def _render(request: HttpRequest, cluster: ComputeCluster | None) -> HttpResponse:
    endpoints = selectors.endpoint_list(user=request.user).select_related("cluster__workspace", "start_command")
    if cluster is not None:
        endpoints = endpoints.filter(cluster=cluster)
    endpoints = list(endpoints.order_by("-created_at")[:200])
    context = {
        "cluster": cluster,
        "rows": _rows(request, endpoints),
        "polling": any(r.status in IN_FLIGHT for e in endpoints for r in [e, *e.replicas.all()]),
        "tab": "endpoints",
    }
    template = "workloads/_endpoints.html" if request.htmx else "workloads/endpoint_list.html"
    response = render(request, template, context)
    if request.htmx and not context["polling"]:
        response.status_code = 286  # htmx stops polling
    return response


@login_required
def endpoint_list(request: HttpRequest) -> HttpResponse:
    """Every endpoint of the user's workspaces."""
    return _render(request, None)


@login_required
def cluster_endpoints(request: HttpRequest, pk: Any) -> HttpResponse:
    """The Endpoints tab of a cluster."""
    cluster = get_object_or_404(ComputeCluster, pk=pk, workspace__in=workspace_ids(user=request.user))
    return _render(request, cluster)


@login_required
@require_POST
def endpoint_action(request: HttpRequest, pk: Any, action: str) -> HttpResponse:
    """Stop a live endpoint, or start a stopped/failed one again (same URL); back to where it was asked."""
    endpoint = get_object_or_404(selectors.endpoint_list(user=request.user), pk=pk)
    if action not in ("stop", "start"):
        raise Http404
    if not can_operate(request.user, endpoint.cluster.workspace):
        raise PermissionDenied("Only workspace Owners and Admins can start or stop endpoints.")
    try:
        if action == "stop":
            workload_services.endpoint_stop(actor=request.user, endpoint=endpoint)
        else:
            workload_services.endpoint_restart(actor=request.user, endpoint=endpoint)
    except (IllegalTransition, PlacementError, ValidationError) as exc:
        messages.error(request, "; ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc))
    else:
        messages.success(request, f"Endpoint {endpoint.hostname}: {action} requested.")
    return _back(request, endpoint)


def _back(request: HttpRequest, endpoint: Endpoint) -> HttpResponse:
    if request.POST.get("from") == "cluster":
        return redirect("workloads:cluster_endpoints", pk=endpoint.cluster_id)
    return redirect("workloads:endpoint_list")


@login_required
@require_POST
def endpoint_update(request: HttpRequest, pk: Any) -> HttpResponse:
    """Roll a running endpoint over to the posted revision and server arguments (Owner/Admin); what went
    wrong (a field's message, nothing to change, no room) comes back as a message on the page."""
    endpoint = get_object_or_404(selectors.endpoint_list(user=request.user), pk=pk)
    if not can_operate(request.user, endpoint.cluster.workspace):
        raise PermissionDenied("Only workspace Owners and Admins can update endpoints.")
    form = EndpointUpdateForm(request.POST)
    if not form.is_valid():
        labels = {name: field.label or name for name, field in form.fields.items()}
        problems = [f"{labels.get(name, name)}: {m}" for name, ms in form.errors.items() for m in ms]
        messages.error(request, f"Endpoint {endpoint.hostname} was not updated: " + "; ".join(problems))
        return _back(request, endpoint)
    try:
        workload_services.endpoint_update(actor=request.user, endpoint=endpoint, **form.changes())
    except ValidationError as exc:
        problems = [m for ms in exc.message_dict.values() for m in ms] if hasattr(exc, "error_dict") else exc.messages
        messages.error(request, f"Endpoint {endpoint.hostname} was not updated: " + "; ".join(problems))
    except (IllegalTransition, PlacementError) as exc:
        messages.error(request, f"Endpoint {endpoint.hostname} was not updated: {exc}")
    else:
        messages.success(
            request,
            f"Endpoint {endpoint.hostname}: rolling update started; each old replica serves until its "
            "replacement answers.",
        )
    return _back(request, endpoint)

"""Endpoint pages: every inference endpoint of the user's workspaces, overall and per cluster, with its
replicas (node, state, requests in flight over all web processes), start/stop and a rolling update
(revision, server arguments) for Owners, Admins and Members (htmx: the table alone, polled while an endpoint or one
of its replicas is on its way); one endpoint's page with its settings, its replicas' load (requests in
flight, tokens/s; polled) and its event log."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from fleet.forms import apply_service_errors
from fleet.models import ComputeCluster
from fleet.replica_load import QueueLoad, ReplicaLoad
from fleet.workloads import benchmark_views, selectors
from fleet.workloads import services as workload_services
from fleet.workloads.errors import error_help
from fleet.workloads.forms import (
    EndpointAdmissionForm,
    EndpointCreateForm,
    EndpointLimitsForm,
    EndpointRoutingForm,
    EndpointUpdateForm,
    server_args_line,
)
from fleet.workloads.groups import group_source
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus, NodeModel, RoutingPolicy
from fleet.workloads.serializers import queue_figures
from fleet.workloads.services import ADMISSION_FIELDS, PlacementError
from kernel.exceptions import IllegalTransition
from tenancy.permissions import can_edit, can_operate
from tenancy.selectors import workspace_ids

IN_FLIGHT = frozenset({EndpointStatus.PENDING, EndpointStatus.STARTING, EndpointStatus.STOPPING})


EVENTS_SHOWN = 100  # the newest lines of an endpoint's event log on its page (the API pages through all)


def _replica_rows(replicas: list[EndpointReplica], loads: dict[str, ReplicaLoad] | None) -> list[dict[str, Any]]:
    """Each replica with its shared load (None when the figures cannot be read) and, for a distributed endpoint's
    rank, its Ray node in words and that node's state now."""
    ray_nodes = [r.ray_node for r in replicas if r.ray_node]
    states = group_source().states(ray_nodes=ray_nodes) if ray_nodes else {}
    return [
        {
            "replica": r,
            "load": None if loads is None else loads.get(r.server_id, ReplicaLoad()),
            "ray": states.get(r.ray_node),
        }
        for r in replicas
    ]


def _rows(request: HttpRequest, endpoints: list[Endpoint]) -> list[dict[str, Any]]:
    operable: dict[Any, bool] = {}
    loads = selectors.replica_loads_shown() if endpoints else None
    rows = []
    for endpoint in endpoints:
        workspace = endpoint.cluster.workspace
        if workspace.pk not in operable:
            operable[workspace.pk] = can_edit(request.user, workspace)
        start = endpoint.start_command
        rows.append(
            {
                "endpoint": endpoint,
                "can_manage": operable[workspace.pk],
                "log_tail": endpoint.failure_message or ((start.result or {}).get("log_tail", "") if start else ""),
                "error_help": error_help(endpoint.failure_code),
                "replicas": _replica_rows(list(endpoint.replicas.all()), loads),
                "server_args": server_args_line(endpoint.server_args),
            }
        )
    return rows


def _ray_clusters_of(cluster: ComputeCluster) -> QuerySet[Any]:
    """The managed Ray clusters on `cluster` (named through the endpoint's relation: fleet does not import raymgr)."""
    return Endpoint._meta.get_field("ray_cluster").related_model._default_manager.filter(compute_cluster=cluster)


def _ray_clusters(cluster: ComputeCluster) -> list[tuple[str, str]]:
    """The create form's choices: the running Ray clusters on `cluster`, with their Ray nodes."""
    rows = _ray_clusters_of(cluster).filter(status="running").order_by("name")
    return [(str(c.pk), f"{c.name} ({c.ray_nodes.filter(status='running').count()} Ray nodes running)") for c in rows]


def _cached_models(cluster: ComputeCluster) -> dict[str, list[str]]:
    """Model id → names of the cluster's nodes holding it."""
    cached: dict[str, set[str]] = {}
    rows = NodeModel.objects.filter(node__cluster=cluster).values_list("model_id", "node__name")
    for model_id, node_name in rows:
        cached.setdefault(model_id, set()).add(node_name)
    return {model: sorted(names) for model, names in cached.items()}


PREFILLED = ("model_id", "revision", "gpus", "min_vram_mb", "server_args")


def _prefill(request: HttpRequest) -> dict[str, str]:
    """The endpoint form's values a link gave (the Models page's Deploy), each a string the form checks."""
    if request.method != "GET":
        return {}
    return {name: request.GET[name][:1000] for name in PREFILLED if request.GET.get(name)}


def _render(
    request: HttpRequest,
    cluster: ComputeCluster | None,
    create_form: EndpointCreateForm | None = None,
    status: int = 200,
) -> HttpResponse:
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
    if cluster is not None and create_form is None and can_edit(request.user, cluster.workspace):
        create_form = EndpointCreateForm(
            cached=_cached_models(cluster), ray_clusters=_ray_clusters(cluster), initial=_prefill(request)
        )
    context["create_form"] = create_form
    context["prefilled"] = bool(_prefill(request))
    template = "workloads/_endpoints.html" if request.htmx else "workloads/endpoint_list.html"
    response = render(request, template, context, status=status)
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
def endpoint_detail(request: HttpRequest, pk: Any) -> HttpResponse:
    """One endpoint: its settings, its replicas with their load, its event log (newest first); any member of
    its workspace reads it. htmx asks for the replicas table alone (polled every few seconds)."""
    endpoint = get_object_or_404(selectors.endpoint_list(user=request.user).select_related("cluster__workspace"), pk=pk)
    context = {
        "endpoint": endpoint,
        "replicas": _replica_rows(list(endpoint.replicas.all()), selectors.replica_loads_shown()),
        "can_manage": can_edit(request.user, endpoint.cluster.workspace),
        "can_operate": can_operate(request.user, endpoint.cluster.workspace),
        "limits_form": EndpointLimitsForm(
            initial={
                "key_requests_per_min": endpoint.key_requests_per_min,
                "key_tokens_per_min": endpoint.key_tokens_per_min,
            }
        ),
        "routing_choices": RoutingPolicy.choices,
        "update_failure": selectors.endpoint_update_failure(endpoint=endpoint),
        "admission_form": EndpointAdmissionForm(initial={name: getattr(endpoint, name) for name in ADMISSION_FIELDS}),
        "window_s": int(settings.REPLICA_LOAD_WINDOW_S),
        "queue": queue_figures(endpoint, (selectors.queue_loads_shown() or {}).get(str(endpoint.pk), QueueLoad())),
        "starts": selectors.endpoint_start_phases(endpoint=endpoint),
    }
    if request.htmx:
        return render(request, "workloads/_endpoint_replicas.html", context)
    context |= benchmark_views.panel_context(endpoint)
    context["events"] = list(selectors.endpoint_event_list(endpoint=endpoint)[:EVENTS_SHOWN])
    context["events_shown"] = EVENTS_SHOWN
    context["adapters"] = [link.adapter for link in endpoint.adapter_links.select_related("adapter")]
    return render(request, "workloads/endpoint_detail.html", context)


@login_required
@require_POST
def cluster_endpoint_create(request: HttpRequest, pk: Any) -> HttpResponse:
    """A new endpoint from the cluster's Endpoints tab (Owner, Admin, Member): 400 with field errors, 409 with the
    reason (no node fits, a quota); else back to the tab."""
    cluster = get_object_or_404(ComputeCluster, pk=pk, workspace__in=workspace_ids(user=request.user))
    if not can_edit(request.user, cluster.workspace):
        raise PermissionDenied("Only workspace Owners, Admins and Members can start endpoints.")
    form = EndpointCreateForm(request.POST, cached=_cached_models(cluster), ray_clusters=_ray_clusters(cluster))
    if not form.is_valid():
        return _render(request, cluster, form, status=400)
    values = form.cleaned_data
    limits = {name: values[name] for name in ("key_requests_per_min", "key_tokens_per_min")}
    try:
        with transaction.atomic():
            endpoint = _create(request, cluster, values)
            if any(v is not None for v in limits.values()):
                workload_services.endpoint_set_key_limits(actor=request.user, endpoint=endpoint, **limits)
    except ValidationError as exc:
        apply_service_errors(form, exc)
        return _render(request, cluster, form, status=400)
    except (IllegalTransition, PlacementError) as exc:  # QuotaExceeded is an IllegalTransition
        messages.error(request, str(exc))
        return _render(request, cluster, form, status=409)
    messages.success(request, f"Endpoint {endpoint.hostname} is starting.")
    return redirect("workloads:cluster_endpoints", pk=cluster.pk)


def _create(request: HttpRequest, cluster: ComputeCluster, values: dict[str, Any]) -> Endpoint:
    return workload_services.endpoint_create(
        actor=request.user,
        cluster=cluster,
        model_id=values["model_id"],
        revision=values["revision"],
        gpus=values["gpus"],
        min_vram_mb=values["min_vram_mb"],
        public=values["public"],
        min_replicas=values["min_replicas"],
        max_replicas=values["max_replicas"],
        idle_timeout_s=values["idle_timeout_s"],
        target_in_flight=values["target_in_flight"] or 0,
        target_tokens_per_s=values["target_tokens_per_s"] or 0,
        target_requests_per_min=values["target_requests_per_min"] or 0,
        scale_cooldown_s=120 if values["scale_cooldown_s"] is None else values["scale_cooldown_s"],
        server_args=values["server_args"],
        routing_policy=values["routing_policy"] or RoutingPolicy.LEAST_LOAD,
        target_queued=values["target_queued"] or 0,
        ray_cluster=_ray_clusters_of(cluster).filter(pk=values["ray_cluster"]).first()
        if values["ray_cluster"]
        else None,
        pipeline_parallel=values["pipeline_parallel"] or 1,
        tensor_parallel=values["tensor_parallel"] or 1,
    )


@login_required
@require_POST
def endpoint_action(request: HttpRequest, pk: Any, action: str) -> HttpResponse:
    """Stop a live endpoint, or start a stopped/failed one again (same URL); back to where it was asked."""
    endpoint = get_object_or_404(selectors.endpoint_list(user=request.user), pk=pk)
    if action not in ("stop", "start"):
        raise Http404
    if not can_edit(request.user, endpoint.cluster.workspace):
        raise PermissionDenied("Only workspace Owners, Admins and Members can start or stop endpoints.")
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


def _form_problems(form: forms.Form) -> list[str]:
    """A refused form's messages, each led by its field's label."""
    labels = {name: field.label or name for name, field in form.fields.items()}
    return [f"{labels.get(name, name)}: {m}" for name, ms in form.errors.items() for m in ms]


def _back(request: HttpRequest, endpoint: Endpoint) -> HttpResponse:
    if request.POST.get("from") == "cluster":
        return redirect("workloads:cluster_endpoints", pk=endpoint.cluster_id)
    if request.POST.get("from") == "detail":
        return redirect("workloads:endpoint_detail", pk=endpoint.pk)
    return redirect("workloads:endpoint_list")


@login_required
@require_POST
def endpoint_limits(request: HttpRequest, pk: Any) -> HttpResponse:
    """Set an endpoint's per-key limits from its page (Owner/Admin); a bad number comes back as a message."""
    endpoint = get_object_or_404(selectors.endpoint_list(user=request.user), pk=pk)
    if not can_operate(request.user, endpoint.cluster.workspace):
        raise PermissionDenied("Only workspace Owners and Admins can change an endpoint's limits.")
    form = EndpointLimitsForm(request.POST)
    if not form.is_valid():
        problems = _form_problems(form)
        messages.error(request, f"The limits of {endpoint.hostname} were not changed: " + "; ".join(problems))
        return _back(request, endpoint)
    workload_services.endpoint_set_key_limits(actor=request.user, endpoint=endpoint, **form.cleaned_data)
    messages.success(request, f"Endpoint {endpoint.hostname}: per-key limits saved.")
    return _back(request, endpoint)


@login_required
@require_POST
def endpoint_admission(request: HttpRequest, pk: Any) -> HttpResponse:
    """Set an endpoint's concurrency limit and queue bounds from its page (Owner/Admin); a bad number comes back
    as a message."""
    endpoint = get_object_or_404(selectors.endpoint_list(user=request.user), pk=pk)
    if not can_operate(request.user, endpoint.cluster.workspace):
        raise PermissionDenied("Only workspace Owners and Admins can change an endpoint's queue.")
    form = EndpointAdmissionForm(request.POST)
    if not form.is_valid():
        problems = _form_problems(form)
        messages.error(request, f"The queue of {endpoint.hostname} was not changed: " + "; ".join(problems))
        return _back(request, endpoint)
    workload_services.endpoint_set_admission(actor=request.user, endpoint=endpoint, **form.cleaned_data)
    messages.success(request, f"Endpoint {endpoint.hostname}: concurrency limit and queue saved.")
    return _back(request, endpoint)


@login_required
@require_POST
def endpoint_update(request: HttpRequest, pk: Any) -> HttpResponse:
    """Roll a running endpoint over to the posted revision and server arguments (Owner, Admin, Member); what went
    wrong (a field's message, nothing to change, no room) comes back as a message on the page."""
    endpoint = get_object_or_404(selectors.endpoint_list(user=request.user), pk=pk)
    if not can_edit(request.user, endpoint.cluster.workspace):
        raise PermissionDenied("Only workspace Owners, Admins and Members can update endpoints.")
    form = EndpointUpdateForm(request.POST)
    if not form.is_valid():
        problems = _form_problems(form)
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


@login_required
@require_POST
def endpoint_routing(request: HttpRequest, pk: Any) -> HttpResponse:
    """Set the endpoint's routing policy (Owner, Admin, Member; at once, no restart); 400 with the field's
    message for an unknown policy, else back to the endpoint's page."""
    endpoint = get_object_or_404(selectors.endpoint_list(user=request.user), pk=pk)
    if not can_edit(request.user, endpoint.cluster.workspace):
        raise PermissionDenied("Only workspace Owners, Admins and Members can change how endpoints route.")
    form = EndpointRoutingForm(request.POST)
    if not form.is_valid():
        problems = "; ".join(m for ms in form.errors.values() for m in ms)
        return HttpResponse(f"Routing policy: {problems}", status=400, content_type="text/plain; charset=utf-8")
    workload_services.endpoint_set_routing(
        actor=request.user, endpoint=endpoint, routing_policy=form.cleaned_data["routing_policy"]
    )
    messages.success(request, f"Endpoint {endpoint.hostname} now routes by {form.cleaned_data['routing_policy']}.")
    return redirect("workloads:endpoint_detail", pk=endpoint.pk)

"""Ray pages: dashboard, Clusters list, create form, detail with htmx tabs, start/stop/delete actions.

A view renders the full page, or for htmx requests only its partial. The summary partial polls while
the cluster is pending, stopping or deleting and stops (HTTP 286) once it is not; so does the header (status
badge, banner, Open Ray Dashboard, buttons), which keeps watching a running cluster every 30 s. The Jobs tab (the
cluster's training jobs, Tune experiments and Serve deployments) polls while one of them is active.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from fleet import live
from kernel.exceptions import IllegalTransition
from raymgr import selectors, services
from raymgr.api.serializers import dashboard_path
from raymgr.forms import RayClusterCreateForm
from raymgr.models import RayCluster, RayClusterStatus
from raymgr.workloads import selectors as wselectors
from tenancy.models import Role
from tenancy.permissions import can_operate
from tenancy.selectors import workspace_ids

TABS = ("summary", "nodes", "jobs", "logs", "events")
IN_PROGRESS = (RayClusterStatus.PENDING, RayClusterStatus.STOPPING, RayClusterStatus.DELETING)
# Tabs that update themselves: their element id (a poll from it that finds nothing changing gets 286).
LIVE_TABS = {"summary": "ray-summary", "jobs": "ray-jobs"}


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    """Ray → Dashboard: Clusters, Deployments, Training Jobs, Tune Experiments cards (htmx refresh 30 s)."""
    from raymgr.workloads.views import cards_context

    return render(request, "raymgr/dashboard.html", cards_context(request.user))


@login_required
def cluster_list(request: HttpRequest) -> HttpResponse:
    """Ray → Clusters, with Start / Stop / Delete on each row for the workspace's Owners and Admins (the
    rows update themselves while a cluster is pending, stopping or deleting)."""
    clusters = list(selectors.ray_cluster_list(user=request.user))
    operable = set(workspace_ids(user=request.user, roles=Role.operators()).values_list("workspace_id", flat=True))
    for c in clusters:
        c.can_operate = c.workspace_id in operable
    every = live.poll_every(changing=any(c.status in IN_PROGRESS for c in clusters))
    context = {"clusters": clusters, "rows_every": every}
    if request.htmx:  # the rows poll themselves while a cluster is pending, stopping or deleting
        return live.respond(request, "raymgr/_cluster_rows.html", context, element_id="ray-cluster-rows", every=every)
    context["can_create"] = bool(operable)
    return render(request, "raymgr/cluster_list.html", context)


@login_required
def cluster_create(request: HttpRequest) -> HttpResponse:
    """Ray → Clusters → New."""
    form = RayClusterCreateForm(request.POST or None, user=request.user)
    if request.method == "POST" and not form.fields["compute_cluster"].queryset.exists():
        raise PermissionDenied("Only workspace Owners and Admins can create Ray clusters.")
    if request.method == "POST" and form.is_valid():
        data = {k: v for k, v in form.cleaned_data.items() if v is not None}  # blank optional: the default
        compute = data.pop("compute_cluster")
        try:
            cluster = services.ray_cluster_create(
                actor=request.user, workspace=compute.workspace, compute_cluster=compute, **data
            )
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        except IllegalTransition as exc:  # a workspace quota refused it: the form says which and why
            form.add_error(None, str(exc))
            return render(request, "raymgr/cluster_form.html", {"form": form}, status=409)
        else:
            # no status in the banner: the page's live header shows it as it changes
            messages.success(request, f"Ray cluster {cluster.name} created.")
            return redirect("raymgr:cluster_detail", pk=cluster.pk)
    status = 400 if request.method == "POST" else 200  # bad input: the form with its field messages
    return render(request, "raymgr/cluster_form.html", {"form": form}, status=status)


def _cluster_for(request: HttpRequest, pk: Any) -> RayCluster:
    """The cluster if it is in one of the user's workspaces; 404 otherwise."""
    return get_object_or_404(selectors.ray_cluster_list(user=request.user), pk=pk)


def _tab_context(cluster: RayCluster, tab: str) -> dict[str, Any]:
    context: dict[str, Any] = {"cluster": cluster, "tab": tab, "dashboard_url": dashboard_path(cluster)}
    status = cluster.last_status or {}
    if tab == "summary":
        context["uptime"] = (
            timezone.now() - cluster.started_at
            if cluster.started_at and cluster.status == RayClusterStatus.RUNNING
            else None
        )
        context["live_every"] = live.poll_every(changing=cluster.status in IN_PROGRESS)
        if cluster.is_kuberay:  # KubeRay's pods, as the head last reported them
            nodes = status.get("nodes") if isinstance(status.get("nodes"), list) else []
            context["workers"] = sum(1 for n in nodes if isinstance(n, dict) and not n.get("is_head"))
        else:
            context["workers"] = cluster.ray_nodes.filter(role="worker").exclude(status="stopped").count()
    elif tab == "nodes":
        context["ray_nodes"] = list(selectors.ray_node_list(cluster=cluster))
    elif tab == "jobs":  # the control plane's workloads on the cluster, then other Ray jobs the head reported
        workloads = wselectors.cluster_workload_list(cluster=cluster)
        known = {w.submission_id for w in workloads if w.submission_id}
        jobs = status.get("jobs") if isinstance(status.get("jobs"), list) else []
        context["workloads"] = workloads
        context["jobs"] = [
            {
                "id": str(j.get("submission_id") or j.get("job_id") or ""),
                "status": str(j.get("status") or ""),
                "entrypoint": str(j.get("entrypoint") or ""),
            }
            for j in jobs
            if isinstance(j, dict) and j.get("submission_id") not in known
        ]
        context["live_every"] = live.poll_every(
            changing=any(w.changing for w in workloads), watched=any(w.active for w in workloads)
        )
    elif tab == "logs":
        logs = status.get("logs") if isinstance(status.get("logs"), dict) else {}
        context["gcs_log"] = str(logs.get("gcs", ""))
        context["autoscaler_log"] = str(logs.get("autoscaler", ""))
    elif tab == "events":
        context["events"] = list(selectors.ray_event_list(cluster=cluster)[:100])
    return context


def _head_context(request: HttpRequest, cluster: RayCluster) -> dict[str, Any]:
    """The live header: name, status badge and banner, Open Ray Dashboard and the action buttons."""
    return {
        "cluster": cluster,
        "dashboard_url": dashboard_path(cluster),
        "can_operate": can_operate(request.user, cluster.workspace),
        "head_url": reverse("raymgr:cluster_detail", args=[cluster.pk]) + "?part=head",
        # pending/stopping/deleting change by the second; a running cluster may still fail, so it is watched
        "head_every": live.poll_every(
            changing=cluster.status in IN_PROGRESS, watched=cluster.status == RayClusterStatus.RUNNING
        ),
    }


@login_required
def cluster_detail(request: HttpRequest, pk: Any) -> HttpResponse:
    """A Ray cluster: live header, then Summary, Nodes, Jobs, Logs, Events tabs (?tab=).

    htmx gets only the tab partial, or with `?part=head` only the header (which polls itself).
    """
    cluster = _cluster_for(request, pk)
    if request.htmx and request.GET.get("part") == "head":
        context = _head_context(request, cluster)
        return live.respond(
            request, "raymgr/_cluster_head.html", context, element_id="ray-cluster-head", every=context["head_every"]
        )
    tab = request.GET.get("tab", "summary")
    if tab not in TABS:
        raise Http404("No such tab.")
    context = _tab_context(cluster, tab)
    if request.htmx:
        if tab in LIVE_TABS:
            every = context["live_every"]
            return live.respond(request, f"raymgr/_tab_{tab}.html", context, element_id=LIVE_TABS[tab], every=every)
        return render(request, f"raymgr/_tab_{tab}.html", context)
    head = _head_context(request, cluster)
    context.update(head, tabs=TABS)
    return render(request, "raymgr/cluster_detail.html", context)


def _act(request: HttpRequest, pk: Any, action: str) -> HttpResponse:
    cluster = _cluster_for(request, pk)
    fn = {"start": services.ray_cluster_start, "stop": services.ray_cluster_stop}[action]
    try:
        cluster = fn(actor=request.user, cluster=cluster)
    except IllegalTransition as exc:
        messages.error(request, str(exc))
        if request.htmx:
            return HttpResponse(str(exc), status=409)
        return redirect(_back(request, reverse("raymgr:cluster_detail", args=[pk])))
    messages.success(request, f"Ray cluster {cluster.name}: {cluster.get_status_display()}.")
    return redirect(_back(request, reverse("raymgr:cluster_detail", args=[pk])))


def _back(request: HttpRequest, default: str) -> str:
    """The posted `next` page when it is the Clusters list (the row actions), else `default`."""
    return reverse("raymgr:cluster_list") if request.POST.get("next") == "list" else default


@login_required
@require_POST
def cluster_start(request: HttpRequest, pk: Any) -> HttpResponse:
    """Start: head back, workers up to min_workers."""
    return _act(request, pk, "start")


@login_required
@require_POST
def cluster_stop(request: HttpRequest, pk: Any) -> HttpResponse:
    """Stop: interrupts running jobs (checkpointed first when enabled)."""
    return _act(request, pk, "stop")


@login_required
@require_POST
def cluster_delete(request: HttpRequest, pk: Any) -> HttpResponse:
    """Delete (after the page's confirm dialog): head, workers and what references the cluster."""
    cluster = _cluster_for(request, pk)
    name = cluster.name
    try:
        remaining = services.ray_cluster_delete(actor=request.user, cluster=cluster)
    except IllegalTransition as exc:
        messages.error(request, str(exc))
        return redirect(_back(request, reverse("raymgr:cluster_detail", args=[pk])))
    if remaining is None:
        messages.success(request, f"Ray cluster {name} deleted.")
    else:
        messages.success(request, f"Ray cluster {name} is being deleted: its Ray nodes are stopping.")
    return redirect("raymgr:cluster_list")

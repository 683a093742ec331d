"""The home page: the fleet at a glance, per workspace of the user (its reads take a constant number of queries).

Per workspace: its compute clusters with nodes online/offline/cordoned (draining counts as cordoned:
it takes no new work either), GPUs (in use = holding memory or busy) and VRAM; running containers,
endpoints and Ray clusters; the most recent failures (commands, endpoints, Ray clusters); and the last
hour in pictures (`cleverthis.fleet_charts`: nodes by state, utilization, commands, endpoint requests and
latency, Ray clusters by state); usage against each of its quotas (`tenancy.quotas`). The page
refreshes itself every 30 s, and at once when a node of one
of the user's workspaces changes state (`fleet.browser_push`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from cleverthis import fleet_history
from cleverthis.fleet_charts import Chart, workspace_charts
from fleet.models import Command, CommandStatus, Node, NodeStatus
from fleet.selectors import cluster_list
from fleet.workloads.models import Container, ContainerStatus, Endpoint, EndpointStatus
from raymgr.models import RayCluster, RayClusterStatus
from tenancy.quotas import QuotaLine, quota_report
from tenancy.selectors import AnyUser, scope_to_user, workspace_list

FAILURE_WINDOW = dt.timedelta(hours=24)
FAILURES_SHOWN = 5


@dataclass
class ClusterGlance:
    """One compute cluster's nodes and GPUs."""

    pk: Any
    name: str
    online: int = 0
    offline: int = 0
    cordoned: int = 0
    gpus: int = 0
    gpus_in_use: int = 0
    vram_used_mb: int = 0
    vram_total_mb: int = 0


@dataclass
class Failure:
    """Something that failed recently, with the page that explains it."""

    when: dt.datetime
    what: str
    detail: str
    url: str


@dataclass
class WorkspaceGlance:
    """A workspace's fleet: clusters, totals, running workloads and recent failures."""

    pk: Any
    name: str
    clusters: list[ClusterGlance] = field(default_factory=list)
    containers: int = 0
    endpoints: int = 0
    ray_clusters: int = 0
    failures: list[Failure] = field(default_factory=list)
    charts: list[Chart] = field(default_factory=list)
    quotas: list[QuotaLine] = field(default_factory=list)

    def total(self, attr: str) -> int:
        """The sum of one node counter over the workspace's clusters."""
        return sum(getattr(c, attr) for c in self.clusters)


def _gpus_in_use(gpus: Any) -> int:
    if not isinstance(gpus, list):
        return 0
    return sum(
        1
        for g in gpus
        if isinstance(g, dict) and ((g.get("memory_used_mb") or 0) > 0 or (g.get("utilization_percent") or 0) > 0)
    )


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def fleet_overview(*, user: AnyUser) -> list[WorkspaceGlance]:
    """Each of the user's workspaces at a glance (workspaces without clusters included)."""
    glances = {ws.pk: WorkspaceGlance(pk=ws.pk, name=ws.name) for ws in workspace_list(user=user).order_by("name")}
    if not glances:
        return []
    clusters: dict[Any, ClusterGlance] = {}
    cluster_workspaces: dict[Any, Any] = {}
    for c in cluster_list(user=user):
        clusters[c.pk] = ClusterGlance(pk=c.pk, name=c.name)
        glances[c.workspace_id].clusters.append(clusters[c.pk])
        cluster_workspaces[c.pk] = c.workspace_id
    nodes = scope_to_user(Node.objects.all(), user=user, workspace_field="cluster__workspace").values_list(
        "cluster_id", "status", "gpu_count", "gpus", "vram_used_mb", "vram_total_mb"
    )
    for cluster_id, status, gpu_count, gpus, vram_used, vram_total in nodes:
        glance = clusters.get(cluster_id)
        if glance is None:
            continue
        if status == NodeStatus.ONLINE:
            glance.online += 1
        elif status == NodeStatus.OFFLINE:
            glance.offline += 1
        else:
            glance.cordoned += 1
        glance.gpus += gpu_count
        glance.gpus_in_use += _gpus_in_use(gpus) if status != NodeStatus.OFFLINE else 0
        glance.vram_used_mb += vram_used if status != NodeStatus.OFFLINE else 0
        glance.vram_total_mb += vram_total
    _count_running(glances, user)
    _recent_failures(glances, user)
    for pk, lines in quota_report(list(glances)).items():  # usage against each quota
        glances[pk].quotas = lines
    _charts(glances, cluster_workspaces)
    return list(glances.values())


def _charts(glances: dict[Any, WorkspaceGlance], cluster_workspaces: dict[Any, Any]) -> None:
    """The last hour's pictures: rollups from Redis (no query), commands per minute (one query)."""
    history = fleet_history.fleet_history(workspace_ids=list(glances))
    commands = fleet_history.commands_per_minute(cluster_workspaces=cluster_workspaces)
    for pk, glance in glances.items():
        glance.charts = workspace_charts(history=history[pk], commands=commands.get(pk) or [{} for _ in history[pk]])


REFRESH_S = 30  # the home page's own refresh; node state changes arrive at once by push


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    """Home: the fleet at a glance per workspace of the user (nodes, GPUs, running work, recent failures,
    the last hour in charts); htmx: just the workspaces (`tenancy/_fleet.html`)."""
    context = {"workspaces": fleet_overview(user=request.user), "refresh_s": REFRESH_S}
    template = "tenancy/_fleet.html" if request.htmx else "tenancy/dashboard.html"
    return render(request, template, context)


def _count_running(glances: dict[Any, WorkspaceGlance], user: AnyUser) -> None:
    sources = (
        ("containers", Container.objects.filter(status=ContainerStatus.RUNNING), "cluster__workspace"),
        ("endpoints", Endpoint.objects.filter(status=EndpointStatus.RUNNING), "cluster__workspace"),
        ("ray_clusters", RayCluster.objects.filter(status=RayClusterStatus.RUNNING), "workspace"),
    )
    for attr, rows, ws_field in sources:
        counted = scope_to_user(rows, user=user, workspace_field=ws_field).values(ws_field).annotate(n=Count("pk"))
        for row in counted:
            setattr(glances[row[ws_field]], attr, row["n"])


def _recent_failures(glances: dict[Any, WorkspaceGlance], user: AnyUser) -> None:
    since = timezone.now() - FAILURE_WINDOW
    commands = scope_to_user(
        Command.objects.filter(status=CommandStatus.FAILED, finished_at__gte=since).select_related("node", "cluster"),
        user=user,
        workspace_field="cluster__workspace",
    ).order_by("-finished_at")[: FAILURES_SHOWN * 4]
    for c in commands:
        glances[c.cluster.workspace_id].failures.append(
            Failure(
                c.finished_at,
                f"{c.command_type} on {c.node.name}",
                _last_line(c.error_message) or c.error_code,
                reverse("fleet:node_detail", args=[c.node_id]),
            )
        )
    endpoints = scope_to_user(
        Endpoint.objects.filter(status=EndpointStatus.FAILED, updated_at__gte=since).select_related("cluster"),
        user=user,
        workspace_field="cluster__workspace",
    ).order_by("-updated_at")[: FAILURES_SHOWN * 4]
    for e in endpoints:
        url = (
            reverse("fleet:node_detail", args=[e.node_id])
            if e.node_id
            else reverse("fleet:cluster_nodes", args=[e.cluster_id])
        )
        glances[e.cluster.workspace_id].failures.append(
            Failure(e.updated_at, f"Endpoint {e.model_id}", _last_line(e.failure_message) or e.failure_code, url)
        )
    rays = scope_to_user(
        RayCluster.objects.filter(status=RayClusterStatus.FAILED, status_changed_at__gte=since), user=user
    ).order_by("-status_changed_at")[: FAILURES_SHOWN * 4]
    for r in rays:
        glances[r.workspace_id].failures.append(
            Failure(
                r.status_changed_at,
                f"Ray cluster {r.name}",
                _last_line(r.failure_reason),
                reverse("raymgr:cluster_detail", args=[r.pk]),
            )
        )
    for glance in glances.values():
        glance.failures = sorted(glance.failures, key=lambda f: f.when, reverse=True)[:FAILURES_SHOWN]

"""Route Ray Dashboards through the tunnel, on origins of their own (`ray-<id>.<RAY_DASHBOARD_DOMAIN>`).

The dashboard can submit jobs, i.e. run code on the cluster, so it always needs a member of the cluster's
workspace, signed in through the browser (API tokens and public access are not accepted). The control
plane's path `/ray/clusters/<id>/dashboard/…` checks the member's session and sends the browser to the
dashboard's origin with a single-use ticket; there the origin cookie it was exchanged for is checked on
every request (`fleet.proxy.origins`). The control plane's session cookie never reaches that origin.

Rights there follow the API's role rules, per method and path (`acts`): every member of the workspace,
Viewers included, may look (GET, HEAD and OPTIONS on Ray's read routes: the UI, jobs and their logs,
actors, nodes, Serve applications, metrics); only Owners and Admins may act, as only they may run Ray
workloads through the API: any other method (submitting, stopping or deleting jobs, uploading packages,
deploying or deleting Serve applications) and the GET routes of Ray 2.x that act (killing an actor,
`/api/actors/kill` and the older `/logical/kill_actor`; starting a profiler inside a live worker,
`/worker/*_profile`, `/task/*_profile`, `/memory_profile`, `/api/launch_profiling`). Others get a 403.
"""

from __future__ import annotations

import re
from typing import Any

from channels.db import database_sync_to_async

from fleet.models import NodeStatus
from fleet.proxy import origin_guard, origins
from fleet.proxy.resolvers import Answer, ProxyRefusal, ProxyTarget, redirect_to_origin, register_resolver
from kernel.asgi_scope import header
from raymgr.models import RayCluster, RayClusterStatus
from tenancy.asgi_auth import user_from_scope
from tenancy.permissions import can_operate, can_view

DASHBOARD_PATH = re.compile(r"^/ray/clusters/(?P<id>[0-9a-f-]{36})/dashboard(?P<rest>/.*)?$")
NO_TOKENS = "The Ray Dashboard needs a signed-in session of a workspace member, not a token."
NOT_AN_OPERATOR = (
    "Only workspace Owners and Admins can act through the Ray Dashboard: submitting or stopping jobs, killing "
    "actors, changing Serve applications or profiling workers there is theirs. Members and Viewers may look; "
    "Members run training jobs, Tune experiments and Serve deployments from the control plane's Ray pages."
)
# GET routes of the Ray Dashboard (2.x) that act, whichever version serves them
ACTING_GET = re.compile(
    r"/(api/actors/kill|logical/kill_actor|api/launch_profiling|memory_profile|(worker|task)/[a-z_]*profile)"
)


def _normalized(path: str) -> str:
    """`path` as the dashboard's router sees it: no empty or `.` segments, `..` applied, no trailing `/`."""
    segments: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if segments:
                segments.pop()
        elif segment not in ("", "."):
            segments.append(segment)
    return "/" + "/".join(segments)


def acts(scope: dict[str, Any]) -> bool:
    """Whether a request on a dashboard's origin changes something (see the module's docstring)."""
    return not origin_guard.is_safe_method(scope) or ACTING_GET.fullmatch(_normalized(scope["path"])) is not None


def _cluster_answer(user: Any, cluster_id: Any) -> RayCluster | ProxyRefusal:
    cluster = RayCluster.objects.select_related("workspace", "head_node").filter(pk=cluster_id).first()
    if cluster is None or not can_view(user, cluster.workspace):
        return ProxyRefusal(404, "No such Ray cluster.")
    if cluster.status != RayClusterStatus.RUNNING or cluster.head_node is None:
        return ProxyRefusal(503, f"The Ray cluster is {cluster.status}; its dashboard is not available.")
    return cluster


def _open_from_control_plane(scope: dict[str, Any], cluster_id: str, rest: str) -> Answer:
    """The path form: a member's session → a ticket redirect to the dashboard's origin."""
    if header(scope, b"authorization"):
        return ProxyRefusal(401, NO_TOKENS)
    user = user_from_scope(scope)
    if not user.is_authenticated:
        return ProxyRefusal(401, "Sign in to open the Ray Dashboard.")
    found = _cluster_answer(user, cluster_id)
    if isinstance(found, ProxyRefusal):
        return found
    return redirect_to_origin(scope, origins.DASHBOARD.host(found.pk), rest)


def _decide(scope: dict[str, Any], cluster_id: str) -> ProxyTarget | ProxyRefusal:
    """A request on the dashboard's own origin: the origin cookie's member, then the head's dashboard."""
    if header(scope, b"authorization"):
        return ProxyRefusal(401, NO_TOKENS)
    user = origins.caller_on_origin(scope, tokens=False)
    if not user.is_authenticated:
        return ProxyRefusal(401, "Open the Ray Dashboard from the control plane while signed in.")
    found = _cluster_answer(user, cluster_id)
    if isinstance(found, ProxyRefusal):
        return found
    if acts(scope) and not can_operate(user, found.workspace):
        return ProxyRefusal(403, NOT_AN_OPERATOR)
    query = scope.get("query_string", b"").decode("latin-1")
    return ProxyTarget(
        node_id=found.head_node.pk,
        port=found.dashboard_port,
        path=scope["path"] + (f"?{query}" if query else ""),
        node_online=found.head_node.status != NodeStatus.OFFLINE,
        host=found.head_service_host,
    )


@register_resolver
async def resolve_dashboard(scope: dict[str, Any]) -> Answer | None:
    """Claim Ray Dashboard origins, and the control plane's dashboard paths (to redirect them)."""
    cluster_id = origins.DASHBOARD.ident(origins.request_host(scope))
    if cluster_id is not None:
        return await database_sync_to_async(_decide)(scope, cluster_id)
    match = DASHBOARD_PATH.match(scope["path"])
    if match is None or origins.is_node_origin(scope):
        return None
    return await database_sync_to_async(_open_from_control_plane)(scope, match["id"], match["rest"] or "/")

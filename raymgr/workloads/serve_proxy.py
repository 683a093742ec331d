"""Route a Serve deployment's HTTP endpoint to its port on the head, through the tunnel, on an origin of
its own: `serve-<deployment id>.<ENDPOINT_DOMAIN>`.

Like fleet endpoints, a Serve deployment answers an API token (``Authorization: Token <key>``) or the
origin cookie a signed-in member of its workspace gets through a ticket (`fleet.proxy.origins`); the
request's path is appended to the route prefix. The older path `/ray/serving/<id>/endpoint/…` on the
control plane's host redirects to that origin and is never proxied.

Who may do what there: every member of the deployment's workspace, Viewers included, may call it with any
method (a `POST` of a prediction is its normal use), as the API lets any member's token call it. Calling a
deployment is using it, not running a workload: deploying, changing or stopping it is done on the control
plane (Owners, Admins and Members), and Ray Serve's HTTP port serves only the deployment's own routes. A browser's
state-changing call made with the origin cookie must come from this very origin (`fleet.proxy.origin_guard`).
"""

from __future__ import annotations

import re
from typing import Any

from channels.db import database_sync_to_async

from fleet import origin_names
from fleet.models import NodeStatus
from fleet.proxy import origins
from fleet.proxy.resolvers import Answer, ProxyRefusal, ProxyTarget, redirect_to_origin, register_resolver
from raymgr.workloads.models import ServeDeployment, ServeStatus
from tenancy.permissions import can_view

SERVE_PATH = re.compile(r"^/ray/serving/(?P<id>[0-9a-f-]{36})/endpoint(?P<rest>/.*)?$")
ANSWERING = (ServeStatus.RUNNING, ServeStatus.DEGRADED)


def decide(scope: dict[str, Any], deployment_id: str) -> ProxyTarget | ProxyRefusal:
    """Where a request on a deployment's origin goes, or why it is refused (sync: ORM)."""
    user = origins.caller_on_origin(scope)
    if not user.is_authenticated:
        return ProxyRefusal(
            401, "This endpoint needs an API key (Authorization: Bearer <key>), or open it from the control plane."
        )
    deployment = (
        ServeDeployment.objects.select_related("workspace", "ray_cluster__head_node").filter(pk=deployment_id).first()
    )
    if deployment is None or not can_view(user, deployment.workspace):
        return ProxyRefusal(404, "No such deployment.")
    head = deployment.ray_cluster.head_node
    if deployment.status not in ANSWERING or head is None:
        return ProxyRefusal(503, f"The deployment is {deployment.status}, not serving.")
    port = (deployment.last_status or {}).get("http_port") or deployment.http_port
    query = scope.get("query_string", b"").decode("latin-1")
    path = deployment.route_prefix.rstrip("/") + scope["path"]
    return ProxyTarget(
        node_id=head.pk,
        port=int(port),
        path=path + (f"?{query}" if query else ""),
        node_online=head.status != NodeStatus.OFFLINE,
        host=deployment.ray_cluster.head_service_host,
    )


@register_resolver
async def resolve_serve(scope: dict[str, Any]) -> Answer | None:
    """Claim Serve deployment origins, and the control plane's Serve paths (to redirect them)."""
    deployment_id = origin_names.SERVE.ident(origins.request_host(scope))
    if deployment_id is not None:
        return await database_sync_to_async(decide)(scope, deployment_id)
    match = SERVE_PATH.match(scope["path"])
    if match is None or origins.is_node_origin(scope):
        return None
    host = origin_names.SERVE.host(match["id"])
    return await database_sync_to_async(redirect_to_origin)(scope, host, match["rest"] or "/")

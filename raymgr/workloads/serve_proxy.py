"""Route `/ray/serving/<id>/endpoint/…` to the deployment's Serve HTTP port on the head, through the tunnel.

Like fleet endpoints, a Serve deployment answers an API token (``Authorization: Token <key>``) or the
session of a member of its workspace. The path after ``endpoint`` is appended to the route prefix.
"""

from __future__ import annotations

import re
from typing import Any

from channels.db import database_sync_to_async

from cleverthis.tenancy.asgi_auth import user_from_scope
from cleverthis.tenancy.permissions import can_view
from fleet.models import NodeStatus
from fleet.proxy.relay import ProxyRefusal, ProxyTarget, register_resolver
from raymgr.workloads.models import ServeDeployment, ServeStatus

SERVE_PATH = re.compile(r"^/ray/serving/(?P<id>[0-9a-f-]{36})/endpoint(?P<rest>/.*)?$")
ANSWERING = (ServeStatus.RUNNING, ServeStatus.DEGRADED)


def decide(scope: dict[str, Any], deployment_id: str, rest: str) -> ProxyTarget | ProxyRefusal:
    """Where a request for a deployment's endpoint goes, or why it is refused (sync: ORM)."""
    user = user_from_scope(scope)
    if not user.is_authenticated:
        return ProxyRefusal(401, "This endpoint needs an API token (Authorization: Token <key>) or a session.")
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
    path = deployment.route_prefix.rstrip("/") + rest
    return ProxyTarget(
        node_id=head.pk,
        port=int(port),
        path=path + (f"?{query}" if query else ""),
        node_online=head.status != NodeStatus.OFFLINE,
    )


@register_resolver
async def resolve_serve(scope: dict[str, Any]) -> ProxyTarget | ProxyRefusal | None:
    """Claim Serve endpoint paths."""
    match = SERVE_PATH.match(scope["path"])
    if match is None:
        return None
    return await database_sync_to_async(decide)(scope, match["id"], match["rest"] or "/")

"""Route `/ray/clusters/<id>/dashboard/…` to the cluster head's Ray Dashboard through the tunnel.

The dashboard can submit jobs, i.e. run code on the cluster, so it always needs the session of a member
of the cluster's workspace (API tokens and public access are not accepted here).
"""

from __future__ import annotations

import re
from typing import Any

from channels.db import database_sync_to_async

from cleverthis.tenancy.asgi_auth import user_from_scope
from cleverthis.tenancy.permissions import can_view
from fleet.models import NodeStatus
from fleet.proxy.relay import ProxyRefusal, ProxyTarget, header, register_resolver
from raymgr.models import RayCluster, RayClusterStatus

DASHBOARD_PATH = re.compile(r"^/ray/clusters/(?P<id>[0-9a-f-]{36})/dashboard(?P<rest>/.*)?$")


def _decide(scope: dict[str, Any], cluster_id: str, rest: str) -> ProxyTarget | ProxyRefusal:
    if header(scope, b"authorization"):
        return ProxyRefusal(401, "The Ray Dashboard needs a signed-in session of a workspace member, not a token.")
    user = user_from_scope(scope)
    if not user.is_authenticated:
        return ProxyRefusal(401, "Sign in to open the Ray Dashboard.")
    cluster = RayCluster.objects.select_related("workspace", "head_node").filter(pk=cluster_id).first()
    if cluster is None or not can_view(user, cluster.workspace):
        return ProxyRefusal(404, "No such Ray cluster.")
    if cluster.status != RayClusterStatus.RUNNING or cluster.head_node is None:
        return ProxyRefusal(503, f"The Ray cluster is {cluster.status}; its dashboard is not available.")
    query = scope.get("query_string", b"").decode("latin-1")
    return ProxyTarget(
        node_id=cluster.head_node.pk,
        port=cluster.dashboard_port,
        path=rest + (f"?{query}" if query else ""),
        node_online=cluster.head_node.status != NodeStatus.OFFLINE,
    )


@register_resolver
async def resolve_dashboard(scope: dict[str, Any]) -> ProxyTarget | ProxyRefusal | None:
    """Claim Ray Dashboard paths."""
    match = DASHBOARD_PATH.match(scope["path"])
    if match is None:
        return None
    return await database_sync_to_async(_decide)(scope, match["id"], match["rest"] or "/")

"""Route endpoint URLs to their node through the tunnel proxy.

Two forms reach the same endpoint: the host `endpoint-<slug>.<ENDPOINT_DOMAIN>` (production, behind a
wildcard DNS record and certificate) and the path `/endpoints/<slug>/…` (local use). Endpoints need an
API token or a session of a workspace member unless they are marked public.
"""

from __future__ import annotations

import re
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings

from cleverthis.tenancy.asgi_auth import user_from_scope
from cleverthis.tenancy.permissions import can_view
from fleet.models import Endpoint, EndpointStatus, NodeStatus
from fleet.proxy import ProxyRefusal, ProxyTarget, header, register_resolver

PATH_FORM = re.compile(r"^/endpoints/(?P<slug>[0-9a-f]{12})(?P<rest>/.*)?$")


def _slug_and_path(scope: dict[str, Any]) -> tuple[str, str] | None:
    host = header(scope, b"host").split(":", 1)[0].lower()
    suffix = "." + settings.ENDPOINT_DOMAIN.lower()
    if host.startswith("endpoint-") and host.endswith(suffix):
        return host[len("endpoint-") : -len(suffix)], scope["path"]
    match = PATH_FORM.match(scope["path"])
    if match:
        return match["slug"], match["rest"] or "/"
    return None


def _decide(scope: dict[str, Any], slug: str, path: str) -> ProxyTarget | ProxyRefusal:
    endpoint = Endpoint.objects.select_related("cluster", "node").filter(slug=slug).first()
    if endpoint is None:
        return ProxyRefusal(404, "No such endpoint.")
    if not endpoint.public:
        user = user_from_scope(scope)
        if not user.is_authenticated:
            return ProxyRefusal(401, "This endpoint needs an API token (Authorization: Token <key>) or a session.")
        if not can_view(user, endpoint.cluster.workspace):
            return ProxyRefusal(404, "No such endpoint.")
    if endpoint.status != EndpointStatus.RUNNING or endpoint.node is None or not endpoint.port:
        return ProxyRefusal(503, f"Endpoint is {endpoint.status}, not running.")
    query = scope.get("query_string", b"").decode("latin-1")
    node = endpoint.node
    return ProxyTarget(
        node_id=node.pk,
        port=endpoint.port,
        path=path + (f"?{query}" if query else ""),
        node_online=node.status != NodeStatus.OFFLINE,
    )


@register_resolver
async def resolve_endpoint(scope: dict[str, Any]) -> ProxyTarget | ProxyRefusal | None:
    """Claim requests for endpoint hosts and `/endpoints/<slug>/` paths."""
    found = _slug_and_path(scope)
    if found is None:
        return None
    return await database_sync_to_async(_decide)(scope, *found)

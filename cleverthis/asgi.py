"""ASGI entry point: HTTP through Django, WebSockets through Channels.

Agent tunnel routes (`/agent/...`) authenticate with node certificates and bypass the session stack;
every other WebSocket route gets the user from the session cookie behind an origin check.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleverthis.settings.base")
# A connection pool per ASGI process (see DATABASE_POOL_MAX_SIZE in settings); 0 in the env turns it off.
# Set only while the settings load, so processes this one starts (workers, tests) do not inherit it.
_pool_default = "DATABASE_POOL_MAX_SIZE" not in os.environ
if _pool_default:
    os.environ["DATABASE_POOL_MAX_SIZE"] = "12"
try:
    django_asgi_app = get_asgi_application()
finally:
    if _pool_default:
        del os.environ["DATABASE_POOL_MAX_SIZE"]

from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from cleverthis import daphne_fixes  # noqa: E402

# Under daphne (development): close frames carry the consumer's reason, and an oversized message gets a
# 1009 close frame instead of a dropped connection (see `cleverthis.daphne_fixes`). Under uvicorn
# (production) the web command's `--ws` protocol does the latter (`cleverthis.uvicorn_fixes`).
daphne_fixes.apply()

if settings.SERVE_STATIC:
    django_asgi_app = ASGIStaticFilesHandler(django_asgi_app)

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator, WebsocketDenier  # noqa: E402

import fleet.proxy.endpoint_routes  # noqa: E402,F401  (registers the endpoint resolver)
import raymgr.dashboard_proxy  # noqa: E402,F401  (registers the Ray Dashboard resolver)
from cleverthis.routing import (  # noqa: E402
    AGENT_PATH_PREFIX,
    agent_websocket_urlpatterns,
    user_websocket_urlpatterns,
)
from fleet.proxy import origin_guard  # noqa: E402
from fleet.proxy.relay import TunnelProxyApp  # noqa: E402
from kernel.asgi_scope import header  # noqa: E402
from kernel.client_address import ForwardedClientMiddleware, TrustedProxies  # noqa: E402


class ControlPlaneOriginOnly:
    """Browser sockets (`/ws/live/`, `/ws/ping/`) only from the control plane's own origin: the Origin must
    be an allowed host (`AllowedHostsOriginValidator`) and not a node origin (`endpoint-*`, `serve-*`,
    `ray-*` under their domains), which ALLOWED_HOSTS lists for the proxy's sake. A node's page shares the
    site, so the browser would send the member's session cookie with it."""

    def __init__(self, app: Any) -> None:
        self.app = AllowedHostsOriginValidator(app)
        self.denier = WebsocketDenier.as_asgi()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        origin = header(scope, b"origin").strip().lower()
        if origin and origin_guard.under_node_domain(urlsplit(origin).hostname or ""):
            return await self.denier(scope, receive, send)
        return await self.app(scope, receive, send)


class WebSocketAudienceRouter:
    """Send `/agent/...` sockets to the agent stack and the rest to the user-session stack."""

    def __init__(self) -> None:
        self.agent_app = URLRouter(agent_websocket_urlpatterns)
        self.user_app = ControlPlaneOriginOnly(AuthMiddlewareStack(URLRouter(user_websocket_urlpatterns)))

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        app = self.agent_app if scope["path"].startswith(AGENT_PATH_PREFIX) else self.user_app
        return await app(scope, receive, send)


# Every reader of the client's address (request limits, API keys' last use) sees the socket's peer, or the
# client a TRUSTED_PROXIES proxy forwarded (`kernel.client_address`); the web command trusts no proxy header.
routes = ProtocolTypeRouter(
    {"http": TunnelProxyApp(django_asgi_app), "websocket": TunnelProxyApp(WebSocketAudienceRouter())}
)
application = ForwardedClientMiddleware(
    routes, TrustedProxies(settings.TRUSTED_PROXIES, resolve_every_s=settings.TRUSTED_PROXIES_RESOLVE_S)
)

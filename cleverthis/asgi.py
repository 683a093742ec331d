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

# Load the URLconf now, and with it every view and serializer module, rather than in the first request each
# process serves (that request took ~1 s more: `/api/v1/endpoints/` 1.1 s cold, 30 ms after).
from django.urls import get_resolver  # noqa: E402

get_resolver().url_patterns  # noqa: B018  (the property imports the URLconf)

# Compile the product's page templates now too (the cached template loader keeps them): a page's first
# render in a process cost 0.3-0.4 s more than its second.
from cleverthis.warm import compile_templates, freeze_start_up_objects  # noqa: E402

compile_templates()

if settings.SERVE_STATIC:
    django_asgi_app = ASGIStaticFilesHandler(django_asgi_app)

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator, WebsocketDenier  # noqa: E402

import fleet.proxy.endpoint_routes  # noqa: E402,F401  (registers the endpoint resolver)
import raymgr.dashboard_proxy  # noqa: E402,F401  (registers the Ray Dashboard resolver)
from cleverthis import graceful  # noqa: E402
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


class DrainOnSigterm:
    """The ASGI app, installing (once, on its first call: uvicorn's loop and signal handlers exist then)
    the drain before uvicorn's SIGTERM shutdown (`cleverthis.graceful`)."""

    def __init__(self, app) -> None:  # type: ignore[no-untyped-def]
        self.app = app
        self.installed = False

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        if not self.installed:
            self.installed = True
            graceful.install()
        return await self.app(scope, receive, send)


# Every reader of the client's address (request limits, API keys' last use) sees the socket's peer, or the
# client a TRUSTED_PROXIES proxy forwarded (`kernel.client_address`); the web command trusts no proxy header.
routes = ProtocolTypeRouter(
    {"http": TunnelProxyApp(django_asgi_app), "websocket": TunnelProxyApp(WebSocketAudienceRouter())}
)
application = DrainOnSigterm(
    ForwardedClientMiddleware(
        routes, TrustedProxies(settings.TRUSTED_PROXIES, resolve_every_s=settings.TRUSTED_PROXIES_RESOLVE_S)
    )
)

# Last: everything loaded above stays for the process's life; out of the garbage collector's full passes
# (`cleverthis.warm.freeze_start_up_objects`), which otherwise stall every stream this process relays.
if settings.WEB_GC_FREEZE:
    freeze_start_up_objects()

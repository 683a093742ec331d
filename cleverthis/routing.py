"""WebSocket URL routes, split by audience.

Agent routes authenticate with node certificates and sit outside the user-session stack; user routes
go through AuthMiddlewareStack. Apps add their patterns here as they grow.
"""

from __future__ import annotations

from django.urls import URLPattern, re_path

from cleverthis.consumers import LiveConsumer, PingConsumer
from fleet.tunnel.consumer import AgentTunnelConsumer
from fleet.tunnel.handshakes import HandshakeAdmission

AGENT_PATH_PREFIX = "/agent/"

agent_websocket_urlpatterns: list[URLPattern] = [
    # past AGENT_MAX_HANDSHAKES handshakes in progress, a Backoff without a consumer
    re_path(r"^agent/tunnel$", HandshakeAdmission(AgentTunnelConsumer.as_asgi())),
]

user_websocket_urlpatterns: list[URLPattern] = [
    re_path(r"^ws/ping/$", PingConsumer.as_asgi()),
    # signed-in browsers: node changes of their workspaces, pushed (fleet.browser_push)
    re_path(r"^ws/live/$", LiveConsumer.as_asgi()),
]

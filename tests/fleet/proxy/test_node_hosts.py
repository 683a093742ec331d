"""Host names under the node-origin domains never reach the control plane's pages.

Finding (black-box probe): `endpoint-zz.endpoints.localhost` (no node object's name: the slug is not
one) was passed on to Django, which served the control plane's pages there (`ALLOWED_HOSTS` was `*`).
Every host under `ENDPOINT_DOMAIN` or `RAY_DASHBOARD_DOMAIN` that names no node object now gets a plain
404 from the proxy; the control plane's own host still reaches Django.
"""

from __future__ import annotations

import asyncio

import pytest

from fleet.proxy import origins, relay

MALFORMED = [
    "endpoint-zz.endpoints.localhost",
    "endpoint-zz.endpoints.localhost:8000",
    "ENDPOINT-ZZ.Endpoints.Localhost",
    "endpoints.localhost",
    "www.endpoints.localhost",
    "a.b.endpoints.localhost:8000",
    "serve-not-a-uuid.endpoints.localhost",
    "ray-1234.ray.localhost",
    "ray.localhost",
    "endpoint-aaaaaaaaaaaa.ray.localhost",  # an endpoint's name under the dashboards' domain
]


def call(host: str, path: str = "/", kind: str = "http") -> tuple[list[dict], list[dict]]:
    """(what the app sent, what reached the inner app) for one request to `host`."""
    reached: list[dict] = []

    async def inner(scope: dict, receive, send) -> None:
        reached.append(scope)
        if kind == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"control plane page"})

    messages = [{"type": "http.request", "body": b""} if kind == "http" else {"type": "websocket.connect"}]

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": kind, "path": path, "query_string": b"", "headers": [(b"host", host.encode())], "scheme": "http"}
    if kind == "http":
        scope["method"] = "GET"
    asyncio.run(relay.TunnelProxyApp(inner)(scope, receive, send))
    return sent, reached


@pytest.mark.django_db
@pytest.mark.parametrize("host", MALFORMED)
@pytest.mark.parametrize("path", ["/", "/accounts/login/", "/api/v1/clusters/", origins.TICKET_PATH])
def test_a_host_under_a_node_domain_that_names_no_node_object_is_a_plain_404(host, path):
    sent, reached = call(host, path)
    assert reached == []
    assert sent[0]["status"] == 404
    assert dict(sent[0]["headers"])[b"content-type"].startswith(b"text/plain")
    assert b"control plane" not in sent[1]["body"]


@pytest.mark.django_db
@pytest.mark.parametrize("host", ["endpoint-zz.endpoints.localhost", "ray-1234.ray.localhost"])
def test_a_websocket_to_such_a_host_is_closed(host):
    sent, reached = call(host, "/ws/ping/", kind="websocket")
    assert reached == []
    assert sent[0]["type"] == "websocket.close"


@pytest.mark.django_db
@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost", "fleet.example.com", "endpoints.localhost.example"])
def test_other_hosts_reach_the_control_plane(host):
    sent, reached = call(host, "/accounts/login/")
    assert len(reached) == 1
    assert sent[0]["status"] == 200


@pytest.mark.django_db
def test_the_control_planes_own_host_is_never_taken_for_a_node_host(settings):
    """Even where the control plane's host lies under an origin domain (a setting to avoid, but not fatal)."""
    settings.CONTROL_PLANE_URL = "https://fleet.example.com"
    settings.ENDPOINT_DOMAIN = "example.com"
    assert len(call("fleet.example.com", "/accounts/login/")[1]) == 1
    assert call("fleet2.example.com", "/accounts/login/")[1] == []

"""The ASGI application routes HTTP to Django and WebSockets to Channels consumers."""

from __future__ import annotations

import json

import pytest
from asgiref.testing import ApplicationCommunicator
from channels.testing import HttpCommunicator, WebsocketCommunicator

from cleverthis.asgi import WebSocketAudienceRouter, application

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_http_goes_to_django():
    communicator = HttpCommunicator(application, "GET", "/healthz", headers=[(b"host", b"127.0.0.1:8000")])
    response = await communicator.get_response()
    assert response["status"] == 200
    assert json.loads(response["body"])["status"] == "ok"


async def test_static_files_are_served():
    scope = {"type": "http", "method": "GET", "path": "/static/js/htmx.min.js", "query_string": b"", "headers": []}
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(5)
    assert start["status"] == 200
    body = b""
    while True:
        message = await communicator.receive_output(5)
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    assert body.startswith(b"var htmx=")


async def test_user_websocket_route_answers():
    communicator = WebsocketCommunicator(application, "/ws/ping/", headers=[(b"origin", b"http://127.0.0.1:8000")])
    connected, _ = await communicator.connect()
    assert connected
    await communicator.send_json_to({"type": "ping"})
    assert await communicator.receive_json_from() == {"type": "pong", "user": None}
    await communicator.disconnect()


async def test_user_websocket_from_foreign_origin_is_refused(settings):
    settings.ALLOWED_HOSTS = ["127.0.0.1"]
    router = WebSocketAudienceRouter()  # reads ALLOWED_HOSTS when built, as at process start
    communicator = WebsocketCommunicator(router, "/ws/ping/", headers=[(b"origin", b"http://evil.example")])
    connected, _ = await communicator.connect()
    assert not connected
    # The denying consumer still listens on the channel layer until the socket is gone: end it cleanly
    # so no Redis receive is left to be cancelled when the event loop closes.
    await communicator.disconnect()


async def test_unknown_websocket_route_is_rejected():
    communicator = WebsocketCommunicator(
        application, "/ws/nothing-here/", headers=[(b"origin", b"http://127.0.0.1:8000")]
    )
    with pytest.raises(ValueError, match="No route found"):
        await communicator.connect()


@pytest.mark.parametrize("path", ["/ws/ping/", "/ws/live/"])
async def test_browser_websockets_refuse_node_origins_though_allowed_hosts_list_their_domains(settings, path):
    """A page served on an endpoint's or a Ray Dashboard's origin (same site: the session cookie goes along)
    cannot open the control plane's browser sockets; the control plane's own origin still can."""
    assert f".{settings.ENDPOINT_DOMAIN}" in settings.ALLOWED_HOSTS  # what made them pass before
    router = WebSocketAudienceRouter()
    for origin in (
        f"http://endpoint-0123456789ab.{settings.ENDPOINT_DOMAIN}:8000",
        f"https://serve-0123456789ab.{settings.ENDPOINT_DOMAIN}",
        f"http://ray-1.{settings.RAY_DASHBOARD_DOMAIN}:8000",
    ):
        communicator = WebsocketCommunicator(router, path, headers=[(b"origin", origin.encode())])
        connected, _ = await communicator.connect()
        assert not connected, origin
        await communicator.disconnect()
    communicator = WebsocketCommunicator(router, "/ws/ping/", headers=[(b"origin", b"http://127.0.0.1:8000")])
    connected, _ = await communicator.connect()
    assert connected
    await communicator.disconnect()

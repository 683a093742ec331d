"""HTTP proxied through a real agent's tunnel, from another process than the web server that holds it.

This test process plays the proxying replica (its own channel-layer connection); the web server holds
the agent's socket; the agent pipes to a real HTTP server on its "node". Exercised: streamed bodies in
both directions, SSE arriving as it is produced, flow control with a slow reader, 502 for a dead target.
The tests marked `both_servers` run on uvicorn (production) and daphne (development) each, two of them
with the client on the web server itself.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from channels.db import database_sync_to_async

from fleet.models import Node
from fleet.proxy import relay, resolvers
from fleet.workloads.models import Endpoint
from tests.e2e.conftest import both_servers, node_of, wait_status
from tests.support.endpoints import endpoint_row
from tests.support.processes import free_port

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

BIG = bytes(range(256)) * 8192  # 2 MiB


HUGE_BYTES = 48 * 1024 * 1024


class Backend(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    huge_written = 0  # bytes of /huge the server managed to hand to its socket so far

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/huge":
            self.send_response(200)
            self.send_header("Content-Length", str(HUGE_BYTES))
            self.end_headers()
            piece = bytes(range(256)) * 1024
            for _ in range(HUGE_BYTES // len(piece)):
                self.wfile.write(piece)
                Backend.huge_written += len(piece)
        elif self.path == "/short":  # announces more than it sends, then hangs up
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"only-this")
            self.close_connection = True
        elif self.path == "/big":
            self.send_response(200)
            self.send_header("Content-Length", str(len(BIG)))
            self.end_headers()
            self.wfile.write(BIG)
        elif self.path == "/sse":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(3):
                event = f"data: {json.dumps({'i': i, 't': time.time()})}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
                time.sleep(0.5)
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(201)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Seen-Path", self.path)
        self.end_headers()
        self.wfile.write(body[::-1])


@pytest.fixture
def backend():
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Backend)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()


async def asgi_call(
    app, method: str, path: str, body: bytes = b"", *, read_delay: float = 0.0, announce_length: bool = True
) -> dict[str, Any]:
    headers = [(b"host", b"relay.test")]
    if body and announce_length:
        headers.append((b"content-length", str(len(body)).encode()))
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": headers if body else [],
        "scheme": "http",
    }
    sent = asyncio.Event()
    chunks = [body[i : i + 100_000] for i in range(0, len(body), 100_000)] or [b""]
    incoming = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    out: dict[str, Any] = {"status": None, "headers": [], "chunks": []}

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop(0)
        await sent.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
            out["headers"] = message["headers"]
        else:
            if message.get("body"):
                out["chunks"].append((time.time(), message["body"]))
                if read_delay:
                    await asyncio.sleep(read_delay)
            if not message.get("more_body"):
                sent.set()

    await asyncio.wait_for(app(scope, receive, send), timeout=60)
    out["body"] = b"".join(c for _, c in out["chunks"])
    return out


@pytest.fixture
def ws_backend():
    """A real WebSocket echo server on the node side (in a thread with its own event loop)."""
    import websockets

    port = free_port()
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    stop = loop.create_future()

    async def echo(connection):
        async for message in connection:
            await connection.send(f"echo:{message}" if isinstance(message, str) else message[::-1])

    async def serve():
        async with websockets.serve(echo, "127.0.0.1", port):
            ready.set()
            await stop

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    ready.wait(10)
    yield port
    loop.call_soon_threadsafe(stop.set_result, None)
    thread.join(10)
    loop.close()


@pytest.fixture
def proxied_node(control_plane, cluster, operator, agents, backend, ws_backend, monkeypatch):
    user, _ = operator
    ports = f"{backend},{ws_backend}"
    proc, state, _env = agents(control_plane, cluster, user, "p", extra_env={"CLEVERTHIS_PROXY_PORTS": ports})
    node = node_of(state)
    wait_status(node, "online")

    async def resolver(scope: dict[str, Any]):
        if not scope["path"].startswith("/test-proxy/"):
            return None
        online = Node.objects.filter(pk=node.pk, connected=True).exists

        return resolvers.ProxyTarget(
            node_id=node.pk,
            port=backend,
            path=scope["path"][len("/test-proxy") :],
            node_online=await database_sync_to_async(online)(),
        )

    monkeypatch.setattr(resolvers, "_resolvers", [resolver])
    return node, proc


def test_large_response_and_request_bodies_stream_through(proxied_node):
    app = relay.TunnelProxyApp(None)

    async def scenario():
        big = await asgi_call(app, "GET", "/test-proxy/big")
        echoed = await asgi_call(app, "POST", "/test-proxy/echo", body=BIG)
        return big, echoed

    big, echoed = asyncio.run(scenario())
    assert big["status"] == 200
    assert big["body"] == BIG
    assert len(big["chunks"]) > 1  # streamed, not buffered into one message
    assert echoed["status"] == 201
    assert echoed["body"] == BIG[::-1]
    assert (b"x-seen-path", b"/echo") in [(k.lower(), v) for k, v in echoed["headers"]]


def test_a_small_request_travels_with_the_opening_message(proxied_node):
    """Body complete in the first ASGI message: sent along with `stream.open`, no further messages up."""
    app = relay.TunnelProxyApp(None)

    async def scenario():
        return await asyncio.gather(
            *(asgi_call(app, "POST", f"/test-proxy/echo{i}", body=b"small %d" % i) for i in range(5))
        )

    for i, answer in enumerate(asyncio.run(scenario())):
        assert answer["status"] == 201
        assert answer["body"] == (b"small %d" % i)[::-1]
        assert (b"x-seen-path", f"/echo{i}".encode()) in [(k.lower(), v) for k, v in answer["headers"]]


@both_servers
def test_sse_events_arrive_as_they_are_produced(proxied_node):
    app = relay.TunnelProxyApp(None)
    result = asyncio.run(asgi_call(app, "GET", "/test-proxy/sse"))
    assert result["status"] == 200
    events = [json.loads(line[6:]) for line in result["body"].decode().split("\n") if line.startswith("data: ")]
    assert [e["i"] for e in events] == [0, 1, 2]
    # the first event reached the client long before the server produced the last one
    first_arrival = result["chunks"][0][0]
    assert first_arrival < events[-1]["t"]


def _public_endpoint(node: Node, port: int) -> Endpoint:
    """A running public endpoint on `node` serving `port`: the web server proxies its origin to the node."""
    cluster = Node.objects.get(pk=node.pk).cluster
    return endpoint_row(cluster=cluster, node=node, model_id="t/m", status="running", port=port, public=True)


@both_servers
def test_sse_through_the_web_server_arrives_as_it_is_produced(proxied_node, control_plane, backend):
    """A client of the web server itself (its HTTP side, not only its tunnel) gets each event as it comes."""
    import http.client

    node, _ = proxied_node
    endpoint = _public_endpoint(node, backend)
    connection = http.client.HTTPConnection("127.0.0.1", control_plane.ports[0], timeout=30)
    try:
        connection.request("GET", "/sse", headers={"Host": endpoint.hostname})
        response = connection.getresponse()
        assert response.status == 200
        assert response.getheader("content-type") == "text/event-stream"
        events, arrivals = [], []
        while len(events) < 3:
            line = response.readline()
            assert line, events
            if line.startswith(b"data: "):
                events.append(json.loads(line[6:]))
                arrivals.append(time.time())
    finally:
        connection.close()
    assert [e["i"] for e in events] == [0, 1, 2]
    assert arrivals[0] < events[-1]["t"]  # the first event came before the server produced the last one


def test_slow_client_still_gets_everything(proxied_node):
    app = relay.TunnelProxyApp(None)
    result = asyncio.run(asgi_call(app, "GET", "/test-proxy/big", read_delay=0.002))
    assert result["body"] == BIG


@both_servers
def test_a_client_that_stops_reading_stops_the_node_instead_of_filling_the_control_plane(
    proxied_node, control_plane, backend
):
    """Real server: the response waits for the client's socket, so credit stops and the agent stops reading.

    uvicorn's `send` waits for the socket itself; daphne's never does, and without the proxy's write
    pressure the control plane would take the whole body from the node into memory while the client
    reads nothing.
    """
    import socket

    node, _ = proxied_node
    endpoint = _public_endpoint(node, backend)
    Backend.huge_written = 0
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    client.connect(("127.0.0.1", control_plane.ports[0]))
    request = f"GET /huge HTTP/1.1\r\nHost: {endpoint.hostname}\r\nConnection: close\r\n\r\n"
    client.sendall(request.encode())
    head = client.recv(4096)
    assert head.startswith(b"HTTP/1.1 200"), head
    time.sleep(3)  # the client reads nothing meanwhile
    stalled_at = Backend.huge_written
    # the socket buffers on the way plus one stream window, far from the whole body
    assert stalled_at < HUGE_BYTES // 2, stalled_at
    received = len(head.split(b"\r\n\r\n", 1)[1])
    client.settimeout(30)
    while chunk := client.recv(1 << 20):
        received += len(chunk)
    client.close()
    assert received == HUGE_BYTES
    assert Backend.huge_written == HUGE_BYTES


def test_a_body_cut_short_by_the_node_ends_the_response_without_an_error_page(proxied_node):
    app = relay.TunnelProxyApp(None)
    result = asyncio.run(asgi_call(app, "GET", "/test-proxy/short"))
    assert result["status"] == 200  # the head had gone out: the client sees the body end early instead
    assert result["body"] == b"only-this"
    assert (b"content-length", b"1000") in [(k.lower(), v) for k, v in result["headers"]]


def test_a_small_body_without_a_length_still_keeps_to_the_body_limit(proxied_node, settings):
    """No Content-Length to refuse up front: a body over the limit is refused, even if it is small."""
    settings.PROXY_MAX_BODY_BYTES = 10
    app = relay.TunnelProxyApp(None)
    over = asyncio.run(asgi_call(app, "POST", "/test-proxy/echo", body=b"eleven byte", announce_length=False))
    assert over["status"] == 413
    assert b"exceeds 10 bytes" in over["body"]


def test_port_not_served_by_the_agent_is_a_502(proxied_node, monkeypatch):
    node, _ = proxied_node

    async def resolver(scope):
        return resolvers.ProxyTarget(node_id=node.pk, port=1, path="/")

    monkeypatch.setattr(resolvers, "_resolvers", [resolver])
    result = asyncio.run(asgi_call(relay.TunnelProxyApp(None), "GET", "/anything"))
    assert result["status"] == 502
    assert b"not proxied" in result["body"]


def test_offline_node_is_a_502_with_a_clear_body(proxied_node, monkeypatch, settings):
    node, _ = proxied_node

    async def resolver(scope):
        return resolvers.ProxyTarget(node_id=node.pk, port=80, path="/", node_online=False)

    monkeypatch.setattr(resolvers, "_resolvers", [resolver])
    result = asyncio.run(asgi_call(relay.TunnelProxyApp(None), "GET", "/x"))
    assert result["status"] == 502
    assert b"offline" in result["body"]


def test_websocket_upgrade_passes_through(proxied_node, ws_backend, monkeypatch):
    node, _ = proxied_node

    async def resolver(scope):
        return resolvers.ProxyTarget(node_id=node.pk, port=ws_backend, path="/ws")

    monkeypatch.setattr(resolvers, "_resolvers", [resolver])

    async def scenario():
        to_app: asyncio.Queue = asyncio.Queue()
        from_app: asyncio.Queue = asyncio.Queue()
        scope = {"type": "websocket", "path": "/ws", "query_string": b"", "headers": []}
        app_task = asyncio.ensure_future(relay.TunnelProxyApp(None)(scope, to_app.get, from_app.put))
        await to_app.put({"type": "websocket.connect"})
        accepted = await asyncio.wait_for(from_app.get(), 20)
        await to_app.put({"type": "websocket.receive", "text": "ping"})
        text = await asyncio.wait_for(from_app.get(), 20)
        await to_app.put({"type": "websocket.receive", "bytes": b"abc"})
        binary = await asyncio.wait_for(from_app.get(), 20)
        await to_app.put({"type": "websocket.disconnect", "code": 1000})
        await asyncio.wait_for(app_task, 20)
        return accepted, text, binary

    accepted, text, binary = asyncio.run(scenario())
    assert accepted == {"type": "websocket.accept"}
    assert text == {"type": "websocket.send", "text": "echo:ping"}
    assert binary == {"type": "websocket.send", "bytes": b"cba"}


def test_the_replica_holding_the_tunnel_dying_mid_response_cuts_the_response_short(proxied_node, control_plane):
    """This process reaches daphne's tunnel over a peer link; daphne is killed after the first SSE event:
    the link drops, the stream ends with an error, and the response ends at once, cut short (no hang)."""
    app = relay.TunnelProxyApp(None)
    scope = {"type": "http", "method": "GET", "path": "/test-proxy/sse", "raw_path": b"/test-proxy/sse"}
    scope |= {"query_string": b"", "headers": [], "scheme": "http"}

    async def scenario() -> tuple[int, list[bytes]]:
        status, chunks = 0, []
        requested = False

        async def receive() -> dict[str, Any]:
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.Event().wait()  # the client stays

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message.get("body"):
                chunks.append(message["body"])
                if len(chunks) == 1:
                    control_plane.replicas[0].kill()

        await asyncio.wait_for(app(scope, receive, send), timeout=20)
        return status, chunks

    status, chunks = asyncio.run(scenario())
    assert status == 200
    events = [line for line in b"".join(chunks).decode().split("\n") if line.startswith("data: ")]
    assert len(events) == 1  # of 3: the rest never came, and the relay did not wait for them

"""HTTP (and WebSocket) proxying to ports on nodes, through the nodes' outbound tunnels.

`TunnelProxyApp` sits in front of Django in the ASGI stack. For requests that a registered resolver
claims (on the node origins of `fleet.proxy.origins`: endpoints, Serve deployments, Ray Dashboards), it
authenticates the caller, opens a `TunnelStream` to the target port on the node and speaks HTTP/1.1
over it with h11: request bodies stream up under credit, responses stream down as they arrive
(chunked, SSE and long-lived responses pass through), with body-size and time limits. The older path
forms on the control plane's own host are answered with a redirect to the node origin, never proxied.
Everything else goes to Django untouched.

Credentials of the control plane (Authorization, its cookies, the CSRF header) are never forwarded to
a node, and no `Set-Cookie` of a node may name a control-plane cookie or reach beyond the node's host.
A state-changing request a browser makes with the origin cookie from another origin is refused (403), and
a host under the node-origin domains that names no node origin gets a plain 404, never the control
plane's pages (`fleet.proxy.origin_guard`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, quote
from uuid import UUID

import h11
from channels.db import database_sync_to_async
from django.conf import settings
from websockets.client import ClientProtocol
from websockets.frames import Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

from fleet.proxy import origin_guard, origins, request_meter
from fleet.proxy.streams import FIRST_BYTES_MAX, StreamUnavailable, TunnelStream
from fleet.proxy.write_pressure import WritePressure
from fleet.usage import meter as usage_meter
from kernel import balancer, replica_load
from kernel.asgi_scope import header
from tenancy.asgi_auth import user_from_scope

log = logging.getLogger("fleet.proxy")

HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"host",
    b"content-length",
}


def upstream_headers(scope: dict[str, Any]) -> list[tuple[bytes, bytes]]:
    """The client's headers minus hop-by-hop ones and the control plane's own credentials.

    The workload on the node must never see the caller's control-plane API token, cookies or CSRF
    token (it could act as the user): `Authorization` and the CSRF header are dropped and our cookies
    (session, CSRF, the node origin's own cookie) are cut from `Cookie`.
    """
    own_cookies = origins.protected_cookie_names()
    dropped = {b"authorization", origins.csrf_header_name()}
    headers = []
    for name, value in scope.get("headers", []):
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in dropped:
            continue
        if lower == b"cookie":
            kept = [
                part.strip()
                for part in value.decode("latin-1").split(";")
                if part.strip() and part.split("=", 1)[0].strip() not in own_cookies
            ]
            if not kept:
                continue
            value = "; ".join(kept).encode("latin-1")
        headers.append((lower, value))
    return headers


@dataclass(frozen=True)
class ProxyTarget:
    """Where a request goes: a port on a node, and the path to send upstream."""

    node_id: UUID
    port: int
    path: str
    node_online: bool = True
    host: str = ""  # an in-cluster host the agent dials (a KubeRay head's Service); '' = the node itself
    meter: str = ""  # the series its requests count in (`request_meter`); '' = not counted
    usage: usage_meter.Subject | None = None  # the endpoint whose usage it counts in (`fleet.usage`)
    # An endpoint's running replicas: an HTTP request goes to the least busy (`balancer`), and one whose
    # connect fails goes once to another; `node_id`/`port` above name the first (a WebSocket goes there).
    replicas: tuple[balancer.Upstream, ...] = ()


@dataclass(frozen=True)
class ProxyRefusal:
    """A resolver's answer when the request is recognised but must not be proxied."""

    status: int
    message: str
    headers: tuple[tuple[bytes, bytes], ...] = ()  # e.g. Retry-After
    content_type: bytes = b"text/plain; charset=utf-8"


@dataclass(frozen=True)
class ProxyRedirect:
    """A resolver's answer for a path form on the control plane's host: go to the node origin instead."""

    location: str
    status: int = 307


Answer = ProxyTarget | ProxyRefusal | ProxyRedirect
Resolver = Callable[[dict[str, Any]], Awaitable[Answer | None]]
_resolvers: list[Resolver] = []
CROSS_ORIGIN = (
    "Refused: a request that changes something on this origin must come from a page of this origin "
    "(Origin or Referer header). API clients send an API key (Authorization: Bearer <key>) instead."
)
NO_SUCH_ORIGIN = "No such endpoint, deployment or dashboard here."
# How long the first try waits for a node's tunnel when another replica could take the request instead.
FAILOVER_GRACE_S = 1.0
# A stream's end before any response byte that counts as a failed connect, worth one try elsewhere: the
# agent could not reach the port (the request never reached a server), or the node's tunnel closed (its
# agent died: the request may have reached the server, whose answer can no longer come back).
_REFUSED = ("cannot connect to ", "is not proxied", "too many open streams", "tunnel closed")
# characters a URL may carry as they are (RFC 3986 reserved and unreserved, and `%` for escapes already
# there); everything else (non-ASCII, spaces, controls, quotes) is percent-encoded
URL_SAFE = "!#$%&'()*+,/:;=?@[]~"


def register_resolver(resolver: Resolver) -> Resolver:
    """Add a resolver; each returns a target, a refusal, or None when the request is not its business."""
    _resolvers.append(resolver)
    return resolver


async def resolve(scope: dict[str, Any]) -> Answer | None:
    """The first resolver's answer, after the checks every node origin shares (`origin_guard`)."""
    if origins.is_node_origin(scope) and origin_guard.from_elsewhere(scope):
        return ProxyRefusal(403, CROSS_ORIGIN)
    for resolver in _resolvers:
        answer = await resolver(scope)
        if answer is not None:
            return answer
    return None


def redirect_to_origin(scope: dict[str, Any], host: str, path: str) -> ProxyRedirect:
    """The answer to a path form on the control plane's host: the same path on the node origin `host`.

    A signed-in member's GET goes through a ticket (so the browser arrives signed in there); anything else
    is sent on as it is (307 keeps method and body; API clients send their token to the origin).
    Sync: reads the session.
    """
    query = scope.get("query_string", b"").decode("latin-1")
    path = origins.safe_next(path) + (f"?{query}" if query else "")
    if scope.get("method") in ("GET", "HEAD") and not header(scope, b"authorization"):
        user = user_from_scope(scope)
        if user.is_authenticated:
            return ProxyRedirect(origins.ticket_redirect(scope, user_id=user.pk, host=host, next_path=path), 302)
    return ProxyRedirect(origins.origin_url(scope, host) + request_target(path).decode("ascii"))


def request_target(path: str) -> bytes:
    """`path` (with its query) as it may go on the wire: ASCII, percent-encoded where it must be.

    The path part is the decoded text of an ASGI `path` (UTF-8), the query part the raw query decoded as
    Latin-1 (one character per byte): each goes back to its bytes before encoding.
    """
    part, mark, query = path.partition("?")
    encoded = quote(part.encode("utf-8", "surrogateescape"), safe=URL_SAFE)
    if mark:
        encoded += "?" + quote(query.encode("latin-1", "replace"), safe=URL_SAFE)
    return encoded.encode("ascii")


async def plain_response(
    send: Callable[..., Awaitable[None]],
    status: int,
    message: str,
    headers: list[tuple[bytes, bytes]] | None = None,
    content_type: bytes = b"text/plain; charset=utf-8",
) -> None:
    """A short answer, text/plain unless told (used for 4xx/5xx and redirects produced by the proxy itself)."""
    body = (message.rstrip("\n") + "\n").encode()
    head = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head + (headers or [])})
    await send({"type": "http.response.body", "body": body})


class TunnelProxyApp:
    """ASGI wrapper: proxy what a resolver claims, pass everything else to `inner`."""

    def __init__(self, inner: Callable[..., Awaitable[None]]) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.inner(scope, receive, send)
            return
        if not origins.is_node_origin(scope) and origin_guard.under_node_domain(origins.request_host(scope)):
            await refuse_unknown_host(scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"] == origins.TICKET_PATH and origins.is_node_origin(scope):
            await exchange_ticket(scope, send)
            return
        answer = await resolve(scope)
        if answer is None:
            await self.inner(scope, receive, send)
        elif scope["type"] == "websocket":
            await proxy_websocket(scope, receive, send, answer)
        elif isinstance(answer, ProxyRedirect):
            location = [(b"location", answer.location.encode("latin-1"))]
            await plain_response(send, answer.status, f"See {answer.location}", location)
        elif isinstance(answer, ProxyRefusal):
            await plain_response(send, answer.status, answer.message, list(answer.headers), answer.content_type)
        elif not answer.node_online:
            offline = "Bad gateway: the node serving this endpoint is offline."
            await request_meter.metered(answer.meter, send, lambda s: plain_response(s, 502, offline))
            usage = usage_meter.start(answer.usage, scope)
            if usage is not None:
                usage.status = 502
                usage.finish(complete=True)
        else:
            usage = usage_meter.start(answer.usage, scope)
            if usage is not None:
                scope, receive = await _asking_for_usage(scope, receive, usage)
            complete = False
            try:
                await request_meter.metered(
                    answer.meter, send, lambda s: proxy_http(scope, receive, s, answer, usage=usage)
                )
                complete = True
            finally:
                if usage is not None:
                    usage.finish(complete=complete and not usage.cut)


async def refuse_unknown_host(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A host under the node-origin domains that names no node origin: a plain 404 (a WebSocket: closed)."""
    if scope["type"] == "websocket":
        if (await receive())["type"] == "websocket.connect":
            await send({"type": "websocket.close", "code": 4404})
        return
    await plain_response(send, 404, NO_SUCH_ORIGIN)


def ticket_next(query_string: bytes) -> bytes | None:
    """The `Location` an exchange goes on to: the query's `next` (default `/`), percent-encoded; None when
    `next` is not a path on this origin. Bytes that are not UTF-8 go on as they came."""
    values = parse_qs(query_string.decode("latin-1"), keep_blank_values=True, encoding="latin-1").get("next")
    if not values:
        return b"/"
    raw = values[0]
    if origins.safe_next(raw) != raw:
        return None
    return quote(raw.encode("latin-1"), safe=URL_SAFE).encode("ascii")


async def exchange_ticket(scope: dict[str, Any], send: Any) -> None:
    """`GET <node origin>/__cleverthis/ticket?ticket=…&next=…`: trade a fresh single-use ticket for the
    origin cookie of this host, then go to `next` (percent-encoded); any other method gets 403.

    The request is checked before the ticket is: one refused for its input (a `next` that is no path on
    this origin: 400) leaves the ticket unused.
    """
    query_string = scope.get("query_string", b"")
    if scope.get("method") != "GET":
        await plain_response(send, 403, "This link expired or was used already: open it again from the control plane.")
        return
    location = ticket_next(query_string)
    if location is None:
        await plain_response(send, 400, "Bad request: next must be a path on this origin (it starts with one /).")
        return
    ticket = (parse_qs(query_string.decode("latin-1")).get("ticket") or [""])[0]
    host = origins.request_host(scope)
    user_id = await database_sync_to_async(origins.redeem_ticket)(ticket, host=host)
    if not user_id:
        await plain_response(send, 403, "This link expired or was used already: open it again from the control plane.")
        return
    secure = origins.origin_url(scope, host).startswith("https:")
    cookie = origins.origin_cookie_header(user_id=user_id, host=host, secure=secure)
    await plain_response(
        send, 302, "Signed in.", [(b"location", location), (b"set-cookie", cookie), (b"cache-control", b"no-store")]
    )


async def _asking_for_usage(
    scope: dict[str, Any], receive: Any, usage: usage_meter.RequestUsage
) -> tuple[dict[str, Any], Any]:
    """A metered streamed completions request that does not ask for its usage is made to
    (`usage_meter.ask_for_usage`): its body is read whole (at most REQUEST_REWRITE_MAX bytes), changed, and
    replayed with its new length; the usage chunk the server adds is then dropped on its way back
    (`usage.strip_usage`). Any other request goes on as sent: (scope, receive) to use from here on."""
    if scope["method"] != "POST" or not scope["path"].endswith("/completions"):
        return scope, receive
    if not header(scope, b"content-type").lower().startswith("application/json"):
        return scope, receive
    messages: list[dict[str, Any]] = []
    size = 0
    whole = False
    while size <= usage_meter.REQUEST_REWRITE_MAX:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        size += len(message.get("body", b""))
        if not message.get("more_body", False):
            whole = True
            break
    changed = None
    if whole and size <= usage_meter.REQUEST_REWRITE_MAX:
        changed = usage_meter.ask_for_usage(b"".join(m.get("body", b"") for m in messages))
    if changed is not None:
        usage.strip_usage = True
        messages = [{"type": "http.request", "body": changed, "more_body": False}]
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-length", b"transfer-encoding")]
        scope = {**scope, "headers": [*headers, (b"content-length", str(len(changed)).encode())]}

    async def replay() -> dict[str, Any]:
        return messages.pop(0) if messages else await receive()

    return scope, replay


def _upstream_request(scope: dict[str, Any], target: ProxyTarget, port: int) -> h11.Request:
    headers = upstream_headers(scope)
    headers += [(b"host", f"127.0.0.1:{port}".encode()), (b"connection", b"close")]
    forwarded_host = header(scope, b"host")
    if forwarded_host:
        headers.append((b"x-forwarded-host", forwarded_host.encode("latin-1")))
    length = header(scope, b"content-length")
    if length.isdigit():
        headers.append((b"content-length", length.encode()))
    elif scope["method"] not in ("GET", "HEAD", "OPTIONS", "DELETE"):
        headers.append((b"transfer-encoding", b"chunked"))
    return h11.Request(method=scope["method"], target=request_target(target.path), headers=headers)


async def proxy_http(
    scope: dict[str, Any],
    receive: Any,
    send: Any,
    target: ProxyTarget,
    *,
    usage: usage_meter.RequestUsage | None = None,
) -> None:
    """Forward one HTTP request to `target` through the tunnel and stream the response back.

    A request whose body arrived whole in the first message (most API calls) travels with the
    stream's opening message; larger ones stream up under the agent's credit. A target with replicas
    sends it to the least busy one, counted in flight until the response ended however it ended; when
    that connect fails (no tunnel, or the agent could not reach the server, before any response byte)
    the request goes once to another replica. `usage` (metered endpoints) sees the response's head and
    body go by, and is marked `cut` when the response did not reach the client whole.
    """
    length = header(scope, b"content-length")
    if length.isdigit() and int(length) > settings.PROXY_MAX_BODY_BYTES:
        await plain_response(send, 413, f"Request body exceeds {settings.PROXY_MAX_BODY_BYTES} bytes.")
        return
    first = await receive()
    if first["type"] == "http.disconnect":
        return
    if not target.replicas:
        only = balancer.Upstream(key="", node_id=target.node_id, port=target.port)
        await _proxy_to(scope, receive, send, target, first, only, last=True, usage=usage)
        return
    lease = balancer.Lease(target.replicas)
    replica_load.PUBLISHER.ensure_running()  # (shares this process's counts with the others)
    try:
        for attempt in range(2):
            upstream = lease.take()
            if upstream is None:
                break
            if usage is not None:
                usage.replica = upstream.key  # its tokens count for the replica that answered
            last = attempt == 1 or len(lease.tried) == len(lease.upstreams)
            if not await _proxy_to(scope, receive, send, target, first, upstream, last=last, usage=usage):
                return
            log.info(
                "endpoint replica %s on node %s refused the request; trying another", upstream.key, upstream.node_id
            )
    finally:
        lease.release()


async def _proxy_to(
    scope: dict[str, Any],
    receive: Any,
    send: Any,
    target: ProxyTarget,
    first: dict[str, Any],
    upstream: balancer.Upstream,
    *,
    last: bool,
    usage: usage_meter.RequestUsage | None = None,
) -> bool:
    """Proxy the request to `upstream`; True (nothing sent to the client) when its connect failed and,
    not being the `last` try, the request may go elsewhere."""
    connection = h11.Connection(h11.CLIENT)
    head = connection.send(_upstream_request(scope, target, upstream.port))
    body = first.get("body", b"")
    # (chunked framing adds a few bytes around the body; a body over the limit takes _forward_body's 413)
    whole = (
        not first.get("more_body", False)
        and len(body) <= settings.PROXY_MAX_BODY_BYTES
        and len(head) + len(body) + 32 <= FIRST_BYTES_MAX
    )
    if whole:
        first_bytes = head + (connection.send(h11.Data(data=body)) if body else b"")
        first_bytes += connection.send(h11.EndOfMessage())
    else:
        first_bytes = head
    try:
        stream = await TunnelStream.open(
            node_id=upstream.node_id,
            port=upstream.port,
            host=target.host,
            grace_s=settings.PROXY_DIAL_GRACE_S if last else min(FAILOVER_GRACE_S, settings.PROXY_DIAL_GRACE_S),
            first_bytes=first_bytes,
            finished=whole,
        )
    except StreamUnavailable as exc:
        if not last:
            return True
        await plain_response(send, 502, f"Bad gateway: {exc}.")
        return False
    relay_state = _RelayState(usage=usage)
    pressure = WritePressure.of(send)
    try:
        if not whole and not await _forward_body(first, receive, stream, connection, send):
            return False
        relay = asyncio.ensure_future(_forward_response(stream, connection, send, relay_state, pressure=pressure))
        client_gone = asyncio.ensure_future(_wait_for_disconnect(receive))
        done, _ = await asyncio.wait({relay, client_gone}, return_when=asyncio.FIRST_COMPLETED)
        client_gone.cancel()
        if relay not in done:  # the client left mid-response (e.g. closed an SSE stream)
            relay.cancel()
            if usage is not None:
                usage.cut = True
            return False
        relay.result()
    except TimeoutError:
        if usage is not None:
            usage.cut = True
        if not relay_state.started:
            await plain_response(send, 504, "Gateway timeout: the service on the node did not answer in time.")
    except (h11.ProtocolError, StreamUnavailable) as exc:
        log.info("proxy stream to node %s port %s broke: %s", upstream.node_id, upstream.port, exc)
        refused = whole and any(part in stream.error for part in _REFUSED)
        if not relay_state.started and refused and not last:
            return True
        if usage is not None:
            usage.cut = True
        if not relay_state.started:  # mid-response the client sees the body cut short instead
            await plain_response(send, 502, f"Bad gateway: {exc}.")
    finally:
        pressure.stop()
        await stream.close()
    return False


async def _wait_for_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _forward_body(
    message: dict[str, Any], receive: Any, stream: TunnelStream, connection: h11.Connection, send: Any
) -> bool:
    """Send the request body up the stream, starting with `message` (the first one the client sent);
    False (after answering 413) when it is too large, or when the client left."""
    total = 0
    while True:
        if message["type"] == "http.disconnect":
            return False
        chunk = message.get("body", b"")
        total += len(chunk)
        if total > settings.PROXY_MAX_BODY_BYTES:
            await plain_response(send, 413, f"Request body exceeds {settings.PROXY_MAX_BODY_BYTES} bytes.")
            return False
        if chunk:
            await stream.write(connection.send(h11.Data(data=chunk)))
        if not message.get("more_body", False):
            await stream.write(connection.send(h11.EndOfMessage()))
            await stream.finish_writing()
            return True
        message = await receive()


@dataclass
class _RelayState:
    """Whether the response head already went to the client (then no error page can follow), and the
    request's usage meter (metered endpoints), which sees the head and the body go by."""

    started: bool = False
    usage: usage_meter.RequestUsage | None = None


async def _forward_response(
    stream: TunnelStream,
    connection: h11.Connection,
    send: Any,
    state: _RelayState | None = None,
    *,
    pressure: WritePressure,
) -> bool:
    """Relay the response as it arrives; returns whether a response head was sent.

    Each body message waits for the client's socket to drain (`WritePressure`) before the next read,
    so a slow client slows the agent down instead of filling the control plane's memory.
    """
    state = state or _RelayState()
    usage = state.usage
    started = False
    timeout: float | None = settings.PROXY_RESPONSE_TIMEOUT_S
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            data = await stream.read(timeout=timeout)
            if not data and not started:
                raise StreamUnavailable(
                    stream.error or "the service on the node closed the connection without answering"
                )
            connection.receive_data(data)
            if data:
                await stream.consumed(len(data))
            continue
        if isinstance(event, h11.InformationalResponse):
            continue
        if isinstance(event, h11.Response):
            headers = _downstream_headers(event.headers)
            if usage is not None:
                usage.head(event.status_code, headers)
                if usage.strip_usage and usage.kind == "sse":  # (its length changes: sent chunked)
                    headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
            await send({"type": "http.response.start", "status": event.status_code, "headers": headers})
            started = state.started = True
            pressure.start()
            send = request_meter.after_head(send)  # (the meter has what it notes: body messages skip it)
            timeout = settings.PROXY_IDLE_TIMEOUT_S  # long-lived (SSE) responses may pause between events
        elif isinstance(event, h11.Data):
            data = bytes(event.data)
            if usage is not None:
                data = usage.feed(data)
                if not data:
                    continue
            await send({"type": "http.response.body", "body": data, "more_body": True})
            if not pressure.writable:
                await pressure.wait()
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            pressure.stop()
            held = usage.held_back() if usage is not None else b""
            with contextlib.suppress(Exception):
                await send({"type": "http.response.body", "body": held, "more_body": False})
            return started


def _downstream_headers(headers: Any) -> list[tuple[bytes, bytes]]:
    """The node's response headers the client may see: no hop-by-hop ones, no control-plane cookies."""
    out = []
    for name, value in headers:
        lower = name.lower()
        if lower in HOP_BY_HOP - {b"content-length"}:
            continue
        if lower == b"set-cookie":
            value = origins.node_set_cookie(bytes(value))
            if value is None:
                continue
        out.append((name, bytes(value)))
    return out


async def proxy_websocket(scope: dict[str, Any], receive: Any, send: Any, answer: Answer) -> None:
    """Pass a WebSocket through: handshake upstream over a tunnel stream, then relay messages both ways.

    Refusals, redirects (path forms), upgrades a browser made from another origin and unreachable targets
    close the client's handshake (HTTP 403 from the ASGI server).
    """
    first = await receive()
    if first["type"] != "websocket.connect":
        return
    if not isinstance(answer, ProxyTarget) or not origins.websocket_origin_allowed(scope):
        await send({"type": "websocket.close", "code": 4403})
        return
    if not answer.node_online:
        await send({"type": "websocket.close", "code": 1011})
        return
    try:
        stream = await TunnelStream.open(
            node_id=answer.node_id, port=answer.port, host=answer.host, grace_s=settings.PROXY_DIAL_GRACE_S
        )
    except StreamUnavailable:
        await send({"type": "websocket.close", "code": 1011})
        return
    upstream = ClientProtocol(parse_uri(f"ws://127.0.0.1:{answer.port}{answer.path}"), max_size=2**24)
    try:
        request = upstream.connect()
        for name, value in upstream_headers(scope):
            if name in (b"cookie", b"origin") and name.decode() not in request.headers:
                request.headers[name.decode()] = value.decode("latin-1")
        upstream.send_request(request)
        await _flush(upstream, stream)
        if not await _await_upstream_handshake(upstream, stream):
            await send({"type": "websocket.close", "code": 1011})
            return
        await send({"type": "websocket.accept"})
        down = asyncio.ensure_future(_relay_upstream(upstream, stream, send))
        up = asyncio.ensure_future(_relay_client(receive, upstream, stream))
        _, pending = await asyncio.wait({down, up}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        with contextlib.suppress(Exception):
            await send({"type": "websocket.close", "code": upstream.close_code or 1000})
    except (StreamUnavailable, TimeoutError, OSError) as exc:
        log.info("websocket proxy to node %s port %s ended: %s", answer.node_id, answer.port, exc)
        with contextlib.suppress(Exception):
            await send({"type": "websocket.close", "code": 1011})
    finally:
        await stream.close()


async def _flush(upstream: ClientProtocol, stream: TunnelStream) -> None:
    for data in upstream.data_to_send():
        if data:
            await stream.write(data)


async def _feed(upstream: ClientProtocol, stream: TunnelStream, timeout: float | None) -> bool:
    data = await stream.read(timeout=timeout)
    if not data:
        upstream.receive_eof()
        return False
    upstream.receive_data(data)
    await stream.consumed(len(data))
    await _flush(upstream, stream)  # pongs and close replies
    return True


async def _await_upstream_handshake(upstream: ClientProtocol, stream: TunnelStream) -> bool:
    while upstream.state is State.CONNECTING:
        if not await _feed(upstream, stream, settings.PROXY_RESPONSE_TIMEOUT_S):
            return False
    upstream.events_received()  # the handshake Response
    return upstream.state is State.OPEN


async def _relay_upstream(upstream: ClientProtocol, stream: TunnelStream, send: Any) -> None:
    while True:
        more = await _feed(upstream, stream, None)
        for event in upstream.events_received():
            if event.opcode is Opcode.TEXT:
                await send({"type": "websocket.send", "text": event.data.decode()})
            elif event.opcode is Opcode.BINARY:
                await send({"type": "websocket.send", "bytes": bytes(event.data)})
        if not more or upstream.state is State.CLOSED:
            return


async def _relay_client(receive: Any, upstream: ClientProtocol, stream: TunnelStream) -> None:
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            upstream.send_close(message.get("code", 1000))
            await _flush(upstream, stream)
            return
        if message.get("text") is not None:
            upstream.send_text(message["text"].encode())
        elif message.get("bytes") is not None:
            upstream.send_binary(message["bytes"])
        await _flush(upstream, stream)

"""HTTP proxying to ports on nodes, through the nodes' outbound tunnels.

`TunnelProxyApp` sits in front of Django in the ASGI stack. For requests that a registered resolver
claims (`fleet.proxy.resolvers`, on the node origins of `fleet.proxy.origins`: endpoints, Serve
deployments, Ray Dashboards), it opens a `TunnelStream` to the target port on the node and speaks
HTTP/1.1 over it with h11: request bodies stream up under credit, responses stream down as they arrive
(chunked, SSE and long-lived responses pass through), with body-size and time limits. WebSockets go to
`fleet.proxy.websocket_relay`, the ticket exchange of a node origin to `fleet.proxy.tickets`. The older
path forms on the control plane's own host are answered with a redirect to the node origin, never
proxied. Everything else goes to Django untouched.

Credentials of the control plane never reach a node, nor a node's cookies the control plane's origin
(`fleet.proxy.headers`). A state-changing request a browser makes with the origin cookie from another
origin is refused (403), and a host under the node-origin domains that names no node origin gets a plain
404, never the control plane's pages (`fleet.proxy.origin_guard`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import h11
from django.conf import settings

from fleet import admission, balancer, replica_load
from fleet.proxy import affinity, origin_guard, origins, request_meter
from fleet.proxy.answers import plain_response
from fleet.proxy.headers import downstream_headers, upstream_headers
from fleet.proxy.resolvers import ProxyRedirect, ProxyRefusal, ProxyTarget, request_target, resolve
from fleet.proxy.streams import FIRST_BYTES_MAX, StreamUnavailable, TunnelStream
from fleet.proxy.tickets import exchange_ticket
from fleet.proxy.websocket_relay import proxy_websocket
from fleet.proxy.write_pressure import WritePressure
from fleet.usage import meter as usage_meter
from kernel.asgi_scope import RATE_CALLER_SCOPE_KEY, header
from kernel.client_address import scope_client_ip

log = logging.getLogger("fleet.proxy")

NO_SUCH_ORIGIN = "No such endpoint, deployment or dashboard here."
# How long the first try waits for a node's tunnel when another replica could take the request instead.
FAILOVER_GRACE_S = 1.0
# A stream's end before any response byte that counts as a failed connect, worth one try elsewhere: the
# agent could not reach the port (the request never reached a server), or the node's tunnel closed (its
# agent died: the request may have reached the server, whose answer can no longer come back).
_REFUSED = ("cannot connect to ", "is not proxied", "too many open streams", "tunnel closed")
# A stream's end before any response byte because the tunnel carrying it closed (its agent moved to another
# replica, or its replica stopped at the drain's deadline), or the peer link to the process holding it was
# lost: the node's tunnel is elsewhere now, and a whole request (its bytes still in hand) is sent again
# there, this many times, before anything reached the client.
MOVED_RETRIES = 1


def _tunnel_gone(error: str) -> bool:
    return error == "tunnel closed" or (error.startswith("peer link to ") and " lost: " in error)


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
    sends it to the one its routing policy picks (`balancer`; the affinity key read from the body's first
    message, `affinity`), counted in flight until the response ended however it ended; when
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
    body = first.get("body", b"")
    replicas = target.replicas
    adapter = target.adapters.get(affinity.requested_model(body) or "") if target.adapters else None
    if adapter is not None:  # a LoRA adapter: the replicas that have it loaded (any, while none has)
        replicas = tuple(u for u in replicas if u.key in adapter[1]) or replicas
        if usage is not None:
            usage.adapter = adapter[0]
    affinity_key = affinity.affinity_key(target.routing, scope, body)
    if target.queue is not None:
        epsilon = settings.ROUTING_EPSILON
        lease = admission.lease_for(target.queue, replicas, target.routing, affinity_key, epsilon)
    else:
        lease = balancer.Lease(replicas, target.routing, affinity_key, settings.ROUTING_EPSILON)
    replica_load.PUBLISHER.ensure_running()  # (shares this process's counts with the others)
    try:
        admitted = None
        if target.queue is not None:
            admitted = await _admit(scope, receive, first, target.queue, lease)
            if admitted is None:  # the client left while waiting
                return
            if isinstance(admitted, admission.Refusal):
                await plain_response(send, 429, admitted.body(), list(admitted.headers()), b"application/json")
                return
        for attempt in range(2):
            upstream = admitted if attempt == 0 and admitted is not None else lease.take(over_limit=attempt > 0)
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


async def _admit(
    scope: dict[str, Any], receive: Any, first: dict[str, Any], queue: admission.QueuePolicy, lease: balancer.Lease
) -> balancer.Upstream | admission.Refusal | None:
    """The replica the request may go to now or after its turn in the endpoint's queue (`admission`), a
    refusal, or None when the client left while it waited (watched only when its body arrived whole)."""
    caller = scope.get(RATE_CALLER_SCOPE_KEY) or f"ip:{scope_client_ip(scope)}"
    waiting = asyncio.ensure_future(
        admission.gate(queue).admit(lease, str(caller), scope.get(admission.DEADLINE_SCOPE_KEY))
    )
    if first.get("more_body", False):
        return await waiting
    if waiting.done():
        return waiting.result()
    client_gone = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait({waiting, client_gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        client_gone.cancel()
        if not waiting.done():
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
    return waiting.result() if not waiting.cancelled() else None


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
    not being the `last` try, the request may go elsewhere. A whole request whose tunnel closed under it
    before any response byte (the node's agent moved to another replica) goes again to the node's tunnel
    as it is now (`MOVED_RETRIES`), from this process: no load balancer retry is needed."""
    grace_s = settings.PROXY_DIAL_GRACE_S if last else min(FAILOVER_GRACE_S, settings.PROXY_DIAL_GRACE_S)
    for hop in range(MOVED_RETRIES + 1):
        connection, first_bytes, whole = _request_start(scope, target, upstream.port, first)
        try:
            stream = await TunnelStream.open(
                node_id=upstream.node_id, port=upstream.port, host=target.host, grace_s=grace_s,
                first_bytes=first_bytes, finished=whole,
            )  # fmt: skip
        except StreamUnavailable as exc:
            if not last:
                return True
            await plain_response(send, 502, f"Bad gateway: {exc}.")
            return False
        outcome = await _relay(receive, send, stream, connection, first, upstream, whole=whole, last=last, usage=usage)
        if outcome != _MOVED:
            return outcome == _ELSEWHERE
        log.info("the tunnel to node %s closed before an answer (try %d)", upstream.node_id, hop + 1)
    if not last:
        return True
    await plain_response(send, 502, "Bad gateway: the node's tunnel closed before an answer.")
    return False


def _request_start(
    scope: dict[str, Any], target: ProxyTarget, port: int, first: dict[str, Any]
) -> tuple[h11.Connection, bytes, bool]:
    """The request's client connection, the bytes that travel with the stream's opening, and whether they
    are the whole request (its body arrived whole in the first message and fits)."""
    connection = h11.Connection(h11.CLIENT)
    head = connection.send(_upstream_request(scope, target, port))
    body = first.get("body", b"")
    # (chunked framing adds a few bytes around the body; a body over the limit takes _forward_body's 413)
    whole = (
        not first.get("more_body", False)
        and len(body) <= settings.PROXY_MAX_BODY_BYTES
        and len(head) + len(body) + 32 <= FIRST_BYTES_MAX
    )
    if not whole:
        return connection, head, False
    first_bytes = head + (connection.send(h11.Data(data=body)) if body else b"")
    return connection, first_bytes + connection.send(h11.EndOfMessage()), True


# What one try on a stream came to: the response went to the client (or failed there for good), the
# request may go to another replica, or the tunnel closed under it before any response byte.
_DONE, _ELSEWHERE, _MOVED = "done", "elsewhere", "moved"


async def _relay(
    receive: Any,
    send: Any,
    stream: TunnelStream,
    connection: h11.Connection,
    first: dict[str, Any],
    upstream: balancer.Upstream,
    *,
    whole: bool,
    last: bool,
    usage: usage_meter.RequestUsage | None,
) -> str:
    """Send the rest of the request up `stream` and its response to the client; what it came to."""
    relay_state = _RelayState(usage=usage)
    pressure = WritePressure.of(send)
    try:
        if not whole and not await _forward_body(first, receive, stream, connection, send):
            return _DONE
        relay = asyncio.ensure_future(_forward_response(stream, connection, send, relay_state, pressure=pressure))
        client_gone = asyncio.ensure_future(_wait_for_disconnect(receive))
        done, _ = await asyncio.wait({relay, client_gone}, return_when=asyncio.FIRST_COMPLETED)
        client_gone.cancel()
        if relay not in done:  # the client left mid-response (e.g. closed an SSE stream)
            relay.cancel()
            if usage is not None:
                usage.cut = True
            return _DONE
        relay.result()
    except TimeoutError:
        if usage is not None:
            usage.cut = True
        if not relay_state.started:
            await plain_response(send, 504, "Gateway timeout: the service on the node did not answer in time.")
    except (h11.ProtocolError, StreamUnavailable) as exc:
        log.info("proxy stream to node %s port %s broke: %s", upstream.node_id, upstream.port, exc)
        if not relay_state.started and whole and _tunnel_gone(stream.error):
            return _MOVED
        refused = whole and any(part in stream.error for part in _REFUSED)
        if not relay_state.started and refused and not last:
            return _ELSEWHERE
        if usage is not None:
            usage.cut = True
        if not relay_state.started:  # mid-response the client sees the body cut short instead
            await plain_response(send, 502, f"Bad gateway: {exc}.")
    finally:
        pressure.stop()
        await stream.close()
    return _DONE


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
            headers = downstream_headers(event.headers)
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

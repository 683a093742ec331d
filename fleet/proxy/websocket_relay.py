"""WebSocket proxying to a port on a node: the handshake goes upstream over a tunnel stream (spoken with the
sans-I/O `websockets` client), then messages are relayed both ways until either side closes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from django.conf import settings
from websockets.client import ClientProtocol
from websockets.frames import Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

from fleet.proxy import origins
from fleet.proxy.headers import upstream_headers
from fleet.proxy.resolvers import Answer, ProxyTarget
from fleet.proxy.streams import StreamUnavailable, TunnelStream

log = logging.getLogger("fleet.proxy")


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

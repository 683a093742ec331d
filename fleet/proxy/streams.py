"""Byte streams to a port on a node, opened from any control-plane process through the channel layer.

The process handling an HTTP request may not be the daphne replica that holds the node's tunnel, so a
stream is set up through Redis: `TunnelStream.open` sends `stream.open` to the node's group; the tunnel
consumer that holds the socket answers `stream.opened` with its own channel name, and from then on both
sides talk directly (`stream.data`, `stream.window`, `stream.end`): towards the tunnel through the
Channels layer to the consumer's channel, back from it through the stream's own Redis list
(`fleet.proxy.stream_pipes`), which carries the response bytes without the channel layer's per-message cost.

Flow control is end to end and credit based: the agent may send only as many response bytes as this
side granted (initial `window`, then `stream.window` increments once bytes were handed to the client),
and this side sends request bytes only against credit the agent returned after writing them locally.
So neither Redis nor the agent ever holds more than one window per stream, however slow the client.

When this very process holds the node's tunnel (one replica, or the request landed on the replica
with the tunnel) the stream skips Redis: it talks to the tunnel consumer in memory (`fleet.tunnel.local_tunnels`),
with the same messages and the same flow control, and no serialisation or network round trip per chunk.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import secrets
import time
from typing import Any

import redis.exceptions
from channels.layers import get_channel_layer

from agent.protocol import DEFAULT_STREAM_WINDOW
from fleet.proxy import stream_pipes
from fleet.tunnel import local_tunnels
from fleet.tunnel.groups import node_group
from kernel import metrics

# Bytes per message sent through the channel layer.
CHUNK_BYTES = 256 * 1024
# Request bytes that may travel with the stream's opening message.
FIRST_BYTES_MAX = 64 * 1024
# A read hands over the response chunks already waiting, joined, up to about this many bytes.
READ_MAX_BYTES = 256 * 1024

_TO_NODE = metrics.PROXY_BYTES.labels(direction="to_node")
_FROM_NODE = metrics.PROXY_BYTES.labels(direction="from_node")
# Response bytes are added to the byte counter per this many (and at the stream's close), not per read:
# a streamed answer is one small read per token, and each counter update costs more than the read.
COUNT_FROM_NODE_EVERY = 64 * 1024


def _time_out(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class StreamUnavailable(Exception):
    """No tunnel answered for the node within the grace period, or the agent refused the stream."""


class TunnelStream:
    """One proxied byte stream to `port` on a node."""

    def __init__(self, layer: Any, pipe: str, stream_id: int, window: int) -> None:
        self._layer = layer
        self._pipe = pipe  # the Redis list the tunnel's replica answers into (fleet.proxy.stream_pipes)
        self.stream_id = stream_id
        self.window = window
        self._consumer: str | None = None
        self._local: local_tunnels.LocalTunnel | None = None
        self._send_credit = DEFAULT_STREAM_WINDOW
        self._credit_changed = asyncio.Event()
        self._incoming: collections.deque[dict[str, Any]] = collections.deque()
        self._arrived: asyncio.Future[None] | None = None  # a read waiting for `_incoming`
        self._pump: asyncio.Task[None] | None = None
        self._unacked_read = 0
        self._uncounted = 0  # response bytes read but not yet added to the byte counter
        self.ended = False
        self.error = ""
        self._counted = False  # counted among the open streams (metrics) until closed

    @classmethod
    async def open(
        cls,
        *,
        node_id: Any,
        port: int,
        host: str = "",
        grace_s: float = 10.0,
        window: int = DEFAULT_STREAM_WINDOW,
        first_bytes: bytes = b"",
        finished: bool = False,
    ) -> TunnelStream:
        """Open a stream; while no tunnel answers (agent reconnecting), retry until `grace_s` runs out.

        `first_bytes` (at most `FIRST_BYTES_MAX`) travel with the open, and `finished` says they are
        the whole request: a small request then costs no further message towards the tunnel.
        """
        if len(first_bytes) > FIRST_BYTES_MAX:
            raise ValueError(f"first_bytes over {FIRST_BYTES_MAX} bytes")
        opening = {"port": port, "host": host, "window": window, "data": first_bytes, "end": finished}
        tunnel = local_tunnels.get(node_id)
        if tunnel is not None:
            stream = cls(None, "", secrets.randbits(52), window)
            stream._local = tunnel
            stream._after_open(opening)
            await tunnel.open_local_stream(stream, opening)
            stream._count_open("local")
            return stream
        layer = get_channel_layer()
        pipe = stream_pipes.new_pipe_key()
        stream = cls(layer, pipe, secrets.randbits(52), window)
        stream._after_open(opening)
        deadline = time.monotonic() + grace_s
        message = {"type": "stream.open", "stream_id": stream.stream_id, "pipe": pipe, **opening}
        try:
            while True:
                try:
                    await layer.group_send(node_group(node_id), message)
                    answers = await stream_pipes.pop(
                        pipe, timeout=min(1.0, max(0.05, deadline - time.monotonic())), most=1
                    )
                except redis.exceptions.ConnectionError as exc:
                    # Redis away, or this process's pool of Redis connections in use to the last one (a
                    # thousand requests opening streams at once): try again until the grace ends. A
                    # re-sent open is ignored by the tunnel that already has it.
                    if time.monotonic() >= deadline:
                        raise StreamUnavailable(f"the control plane could not reach the node's tunnel ({exc})") from exc
                    await asyncio.sleep(0.05 + secrets.randbelow(150) / 1000)
                    continue
                if not answers:
                    if time.monotonic() >= deadline:
                        raise StreamUnavailable("the node's agent is not connected")
                    continue
                answer = answers[0]
                if answer["type"] == "stream.opened":
                    stream._consumer = answer["consumer"]
                    break
                if answer["type"] == "stream.end":
                    raise StreamUnavailable(answer.get("error") or "the agent refused the stream")
        except StreamUnavailable:
            await stream_pipes.remove(pipe)
            raise
        stream._pump = asyncio.ensure_future(stream._receive_loop())
        stream._count_open("redis")
        return stream

    def _after_open(self, opening: dict[str, Any]) -> None:
        self._send_credit -= len(opening["data"])  # the first bytes count against the agent's window
        _TO_NODE.inc(len(opening["data"]))

    def _count_open(self, via: str) -> None:
        metrics.PROXY_STREAMS.labels(via=via).inc()
        metrics.PROXY_STREAMS_ACTIVE.inc()
        self._counted = True

    async def _receive_loop(self) -> None:
        """Messages from the tunnel's replica, popped from this stream's Redis list until its end."""
        while True:
            for message in await stream_pipes.pop(self._pipe, timeout=5.0):
                self.deliver(message)
                if message["type"] == "stream.end":
                    return

    def deliver(self, message: dict[str, Any]) -> None:
        """A message from the tunnel consumer: response bytes, returned credit, or the end."""
        if message.get("type") == "stream.window":
            self._send_credit += int(message.get("increment", 0))
            self._credit_changed.set()
        elif message.get("type") == "stream.opened":
            pass  # a late answer to an open this stream re-sent while waiting: it is open already
        else:
            self._incoming.append(message)
            if self._arrived is not None and not self._arrived.done():
                self._arrived.set_result(None)

    async def write(self, data: bytes) -> None:
        """Send request bytes, waiting for credit from the agent when the window is used up."""
        view = memoryview(data)
        while view:
            while self._send_credit <= 0:
                if self.ended:
                    raise StreamUnavailable(self.error or "stream closed")
                self._credit_changed.clear()
                await self._credit_changed.wait()
            size = min(len(view), CHUNK_BYTES, self._send_credit)
            self._send_credit -= size
            _TO_NODE.inc(size)
            await self._to_consumer({"type": "stream.data", "data": bytes(view[:size])})
            view = view[size:]

    async def finish_writing(self) -> None:
        """The request is complete (the agent keeps the upstream socket open for the response)."""
        await self._to_consumer({"type": "stream.end", "error": ""})

    async def read(self, timeout: float | None = None) -> bytes:
        """The next response bytes; b"" at the end of the stream.

        Chunks that are already waiting come back joined (up to `READ_MAX_BYTES`): a relay that fell
        behind catches up with one write to its client instead of one per chunk.
        """
        if self.ended:
            return b""
        incoming = self._incoming
        if not incoming:
            loop = asyncio.get_running_loop()
            self._arrived = arrived = loop.create_future()
            timer = loop.call_later(timeout, _time_out, arrived) if timeout is not None else None
            try:
                await arrived  # TimeoutError when the timer fired first
            finally:
                self._arrived = None
                if timer is not None:
                    timer.cancel()
        message = incoming.popleft()
        if message["type"] == "stream.end":
            self.ended = True
            self.error = message.get("error", "")
            return b""
        data = message["data"]
        if incoming and incoming[0]["type"] == "stream.data":
            parts, size = [data], len(data)
            while incoming and incoming[0]["type"] == "stream.data" and size < READ_MAX_BYTES:
                part = incoming.popleft()["data"]
                parts.append(part)
                size += len(part)
            data = b"".join(parts)
        self._uncounted += len(data)
        if self._uncounted >= COUNT_FROM_NODE_EVERY:
            _FROM_NODE.inc(self._uncounted)
            self._uncounted = 0
        return data

    async def consumed(self, size: int) -> None:
        """Tell the agent `size` response bytes reached the client, returning that much credit.

        Credit goes back in batches of a quarter window so small reads do not cost one message each.
        """
        self._unacked_read += size
        if self._unacked_read >= self.window // 4:
            increment, self._unacked_read = self._unacked_read, 0
            await self._to_consumer({"type": "stream.window", "increment": increment})

    async def close(self) -> None:
        """Abort the stream (client went away) and release the agent's connection."""
        if self._uncounted:
            _FROM_NODE.inc(self._uncounted)
            self._uncounted = 0
        if self._counted:
            self._counted = False
            metrics.PROXY_STREAMS_ACTIVE.dec()
        if not self.ended:
            self.ended = True
            with contextlib.suppress(Exception):
                await self._to_consumer({"type": "stream.end", "error": "closed by control plane"})
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(Exception):
                await stream_pipes.remove(self._pipe)

    async def _to_consumer(self, message: dict[str, Any]) -> None:
        if self._local is not None:
            await self._local.stream_message({**message, "stream_id": self.stream_id})
            return
        assert self._consumer is not None
        await self._layer.send(self._consumer, {**message, "stream_id": self.stream_id})

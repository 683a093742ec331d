"""Byte streams to a port on a node, opened from any control-plane process.

The process handling an HTTP request may not be the one holding the node's tunnel. `TunnelStream.open`
looks for the tunnel in this process first (`fleet.tunnel.local_tunnels`): then the stream talks to the
tunnel consumer in memory, no serialisation, no network. Otherwise it asks where the tunnel is held
(`fleet.proxy.peer_routes`: the peer address that process recorded on the node row) and opens the stream
there over a peer link (`fleet.proxy.peer_dialer`): one persistent, authenticated TCP connection per
pair of processes, carrying every stream between them. The process holding the tunnel may answer
"not here" (the tunnel moved, the agent is reconnecting elsewhere): the opener reads the address again
and retries until its grace period ends.

Flow control is end to end and credit based: the agent may send only as many response bytes as this
side granted (initial `window`, then `stream.window` increments once bytes were handed to the client),
and this side sends request bytes only against credit the agent returned after writing them locally.
So neither a peer link nor the agent ever holds more than one window per stream, however slow the client.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import secrets
import time
from typing import Any

from django.db import DatabaseError

from agent.protocol import DEFAULT_STREAM_WINDOW
from fleet.proxy import peer_dialer, peer_routes
from fleet.tunnel import local_tunnels, peer_listener, peer_wire
from kernel import metrics

# Request bytes per data message towards the tunnel.
CHUNK_BYTES = peer_wire.DATA_MAX
# Request bytes that may travel with the stream's opening message.
FIRST_BYTES_MAX = 64 * 1024
# A read hands over the response chunks already waiting, joined, up to about this many bytes.
READ_MAX_BYTES = 256 * 1024
# Between two attempts to find the node's tunnel (doubling up to the last), while the grace lasts.
RETRY_PAUSES_S = (0.05, 0.1, 0.2, 0.4, 0.5)

_TO_NODE = metrics.PROXY_BYTES.labels(direction="to_node")
_FROM_NODE = metrics.PROXY_BYTES.labels(direction="from_node")
_OPENED = {via: metrics.PROXY_STREAMS.labels(via=via) for via in ("local", "peer")}
# Response bytes are added to the byte counter per this many (and at the stream's close), not per read:
# a streamed answer is one small read per token, and each counter update costs more than the read.
COUNT_FROM_NODE_EVERY = 64 * 1024


class StreamUnavailable(Exception):
    """No tunnel answered for the node within the grace period, or the agent refused the stream."""


class TunnelStream:
    """One proxied byte stream to `port` on a node."""

    def __init__(self, stream_id: int, window: int) -> None:
        self.stream_id = stream_id
        self.window = window
        self._local: local_tunnels.LocalTunnel | None = None  # the tunnel, when this process holds it
        self._peer: peer_dialer.DialedLink | None = None  # else the link to the process that holds it
        self._send_credit = DEFAULT_STREAM_WINDOW
        self._credit_changed = asyncio.Event()
        self._incoming: collections.deque[dict[str, Any]] = collections.deque()
        self._arrived: asyncio.Future[None] | None = None  # a read waiting for `_incoming`
        # A waiting read times out at `_read_deadline` (loop time). One timer per stream, re-armed only when
        # it fires early, instead of a timer made and cancelled for every chunk read.
        self._read_deadline = math.inf
        self._read_timer: asyncio.TimerHandle | None = None
        self._unacked_read = 0
        self._uncounted = 0  # response bytes read but not yet added to the byte counter
        self._end_arrived = False  # the agent ended the stream (the end may still wait in `_incoming`)
        self.ended = False
        self.error = ""
        self._counted = False  # counted among the open streams (metrics) until closed
        self._why_not = "the node's agent is not connected"  # why the last attempt to open failed

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
        stream = cls(secrets.randbits(52), window)
        deadline = time.monotonic() + grace_s
        for attempt in range(1_000_000):
            tunnel = local_tunnels.get(node_id)
            if tunnel is not None:
                stream._local = tunnel
                stream._after_open(opening)
                await tunnel.open_local_stream(stream, opening)
                stream._count_open("local")
                return stream
            if await stream._open_at_peer(node_id, opening, deadline):
                stream._after_open(opening)
                stream._count_open("peer")
                return stream
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await asyncio.sleep(min(RETRY_PAUSES_S[min(attempt, len(RETRY_PAUSES_S) - 1)], left))
        raise StreamUnavailable(stream._why_not)

    async def _open_at_peer(self, node_id: Any, opening: dict[str, Any], deadline: float) -> bool:
        """Open the stream at the process holding the node's tunnel; False (with `_why_not`) to try again."""
        try:
            address = await peer_routes.peer_of(node_id)
        except DatabaseError as exc:
            self._why_not = f"the control plane could not look up the node's tunnel ({exc})"
            return False
        if not address:
            self._why_not = "the node's agent is not connected"
            return False
        if address == peer_listener.current_address():  # recorded as held here, but it is not (any more)
            peer_routes.forget(node_id, address)
            self._why_not = "the node's agent is not connected"
            return False
        wire_opening = peer_wire.Opening(str(node_id), **opening)
        try:
            link = await peer_dialer.links().link_to(address)
            timeout = max(0.05, deadline - time.monotonic())
            opened = await link.open(self.stream_id, self, wire_opening, timeout=timeout)
        except (peer_dialer.PeerUnreachable, TimeoutError) as exc:
            peer_routes.forget(node_id, address)
            self._why_not = f"the control plane could not reach the node's tunnel ({exc or 'no answer'})"
            return False
        if not opened:  # the tunnel left that process: ask the database again
            peer_routes.forget(node_id, address)
            self._why_not = "the node's agent is not connected"
            return False
        self._peer = link
        return True

    def _after_open(self, opening: dict[str, Any]) -> None:
        self._send_credit -= len(opening["data"])  # the first bytes count against the agent's window
        _TO_NODE.inc(len(opening["data"]))

    def _count_open(self, via: str) -> None:
        _OPENED[via].inc()
        metrics.PROXY_STREAMS_ACTIVE.inc()
        self._counted = True

    def deliver(self, message: dict[str, Any]) -> None:
        """A message from the tunnel consumer (or the peer link to it): response bytes, returned credit,
        or the end."""
        if message.get("type") == "stream.window":
            self._send_credit += int(message.get("increment", 0))
            self._credit_changed.set()
        else:
            if message.get("type") == "stream.end":
                self._end_arrived = True
                self.error = self.error or message.get("error", "")
                self._credit_changed.set()  # a write waiting for credit gets none any more
            self._incoming.append(message)
            if self._arrived is not None and not self._arrived.done():
                self._arrived.set_result(None)

    async def write(self, data: bytes) -> None:
        """Send request bytes, waiting for credit from the agent when the window is used up."""
        view = memoryview(data)
        while view:
            while self._send_credit <= 0:
                if self.ended or self._end_arrived:
                    raise StreamUnavailable(self.error or "stream closed")
                self._credit_changed.clear()
                await self._credit_changed.wait()
            size = min(len(view), CHUNK_BYTES, self._send_credit)
            self._send_credit -= size
            _TO_NODE.inc(size)
            await self._to_tunnel({"type": "stream.data", "data": bytes(view[:size])})
            view = view[size:]

    async def finish_writing(self) -> None:
        """The request is complete (the agent keeps the upstream socket open for the response)."""
        await self._to_tunnel({"type": "stream.end", "error": ""})

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
            self._arm_read_timer(loop, timeout)
            try:
                await arrived  # TimeoutError when the timer fired first
            finally:
                self._arrived = None
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

    def _arm_read_timer(self, loop: asyncio.AbstractEventLoop, timeout: float | None) -> None:
        """Let the waiting read time out after `timeout` s (None: never), reusing the stream's timer."""
        if timeout is None:
            self._read_deadline = math.inf
            return
        self._read_deadline = deadline = loop.time() + timeout
        timer = self._read_timer
        if timer is not None and timer.when() <= deadline:
            return  # it fires first, sees the later deadline and waits on
        if timer is not None:
            timer.cancel()
        self._read_timer = loop.call_at(deadline, self._read_timer_fired)

    def _read_timer_fired(self) -> None:
        self._read_timer = None
        arrived = self._arrived
        if arrived is None or arrived.done() or self._read_deadline == math.inf:
            return  # no read waits (the next one arms the timer again)
        loop = arrived.get_loop()
        if loop.time() >= self._read_deadline:
            arrived.set_exception(TimeoutError())
        else:
            self._read_timer = loop.call_at(self._read_deadline, self._read_timer_fired)

    async def consumed(self, size: int) -> None:
        """Tell the agent `size` response bytes reached the client, returning that much credit.

        Credit goes back in batches of a quarter window so small reads do not cost one message each.
        """
        self._unacked_read += size
        if self._unacked_read >= self.window // 4:
            increment, self._unacked_read = self._unacked_read, 0
            await self._to_tunnel({"type": "stream.window", "increment": increment})

    async def close(self) -> None:
        """Abort the stream (client went away) and release the agent's connection."""
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        if self._uncounted:
            _FROM_NODE.inc(self._uncounted)
            self._uncounted = 0
        if self._counted:
            self._counted = False
            metrics.PROXY_STREAMS_ACTIVE.dec()
        if not self.ended:
            self.ended = True
            with contextlib.suppress(Exception):
                await self._to_tunnel({"type": "stream.end", "error": "closed by control plane"})
        if self._peer is not None:
            self._peer.forget(self.stream_id)

    async def _to_tunnel(self, message: dict[str, Any]) -> None:
        """A message for the tunnel consumer: in memory, or as a frame on the peer link to its process."""
        if self._local is not None:
            await self._local.stream_message({**message, "stream_id": self.stream_id})
            return
        assert self._peer is not None
        kind, stream_id = message["type"], self.stream_id
        try:
            if kind == "stream.data":
                data = message["data"]
                self._peer.send(peer_wire.header(peer_wire.DATA, stream_id, len(data)), data)
            elif kind == "stream.window":
                self._peer.send(peer_wire.window_frame(stream_id, message["increment"]))
            else:
                self._peer.send(peer_wire.end_frame(stream_id, message.get("error", "")))
        except peer_dialer.PeerUnreachable as exc:
            raise StreamUnavailable(str(exc)) from exc

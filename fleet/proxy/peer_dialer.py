"""The opening side of peer links: this process reaches the process holding a node's tunnel directly.

`links()` is this event loop's pool: one link per peer address, dialed on first use, authenticated
(`peer_wire`'s handshake: both ends prove they hold the key derived from SECRET_KEY) and kept for every
later stream to that peer. `DialedLink.open` registers a stream (anything with `deliver`, as the tunnel
hands messages to: `TunnelStream`), sends OPEN and waits for OPENED or NOT_HERE; afterwards the link
hands the stream its DATA, WINDOW and END as they arrive. A link that drops ends each of its streams
with an error, and the next open dials again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from fleet.tunnel import peer_wire
from fleet.tunnel.peer_link import PeerLink

log = logging.getLogger("fleet.proxy.peers")

# How long dialing and the handshake may take before the peer counts as unreachable.
DIAL_TIMEOUT_S = 5.0


class PeerUnreachable(Exception):
    """The peer could not be dialed, refused the handshake, or its link dropped before an answer."""


class PeerStream(Protocol):
    """What a link hands a stream's messages to (`stream.data`, `stream.window`, `stream.end` dicts)."""

    def deliver(self, message: dict[str, Any]) -> None: ...


class DialedLink:
    """One link this process dialed: the handshake, then the streams it opened over it."""

    def __init__(self, address: str, pool: PeerLinks) -> None:
        self.address = address
        self._pool = pool
        self._key = peer_wire.link_key()
        self._nonce = peer_wire.new_nonce()
        self._link: PeerLink | None = None
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._streams: dict[int, PeerStream] = {}
        self._answers: dict[int, asyncio.Future[int]] = {}  # opens waiting for OPENED / NOT_HERE
        self.lost = ""  # why the link is gone, once it is

    @property
    def usable(self) -> bool:
        return not self.lost

    def dial(self) -> None:
        task = asyncio.get_running_loop().create_task(self._dial())
        task.add_done_callback(self._dialed)

    async def _dial(self) -> None:
        host, port = peer_wire.parse_address(self.address)
        loop = asyncio.get_running_loop()
        _, link = await loop.create_connection(lambda: PeerLink(self, self.address), host, port)
        self._link = link
        link.send(peer_wire.hello_frame(self._nonce))

    def _dialed(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            self._lose("dialing cancelled")
        elif task.exception() is not None:
            log.warning("peer link to %s: dialing failed: %s", self.address, task.exception())
            self._lose(f"dialing failed: {task.exception()}")

    async def ready(self) -> None:
        """Wait for the handshake; `PeerUnreachable` if it failed."""
        async with asyncio.timeout(DIAL_TIMEOUT_S):
            await asyncio.shield(self._ready)

    async def open(self, stream_id: int, stream: PeerStream, opening: peer_wire.Opening, timeout: float) -> bool:
        """Open `stream` at the peer: True once OPENED (its messages then reach `stream`), False when the
        node's tunnel is not held there; `PeerUnreachable` when the link drops first, `TimeoutError`."""
        if self.lost or self._link is None:
            raise PeerUnreachable(self.lost or "not connected")
        answer = asyncio.get_running_loop().create_future()
        self._answers[stream_id] = answer
        self._streams[stream_id] = stream
        try:
            self._link.send(peer_wire.open_frame(stream_id, opening))
            async with asyncio.timeout(timeout):
                kind = await answer
        except BaseException:
            self._answers.pop(stream_id, None)
            if self._streams.pop(stream_id, None) is not None and not self.lost:
                self.send(peer_wire.end_frame(stream_id, "open abandoned"))  # the peer may have opened it
            raise
        if kind == peer_wire.NOT_HERE:
            self._streams.pop(stream_id, None)
            return False
        return True

    def send(self, *parts: bytes) -> None:
        """A frame for the peer; `PeerUnreachable` when the link is gone."""
        if self.lost or self._link is None or self._link.closed:
            raise PeerUnreachable(self.lost or f"peer link to {self.address} closed")
        self._link.send(*parts)

    def forget(self, stream_id: int) -> None:
        """The stream is over on this side: nothing more is handed to it."""
        self._streams.pop(stream_id, None)

    # ---- LinkHandler

    def frame_received(self, link: PeerLink, kind: int, stream_id: int, payload: bytes) -> None:
        if kind == peer_wire.DATA:
            stream = self._streams.get(stream_id)
            if stream is not None:
                stream.deliver({"type": "stream.data", "data": payload})
        elif kind == peer_wire.WINDOW:
            stream = self._streams.get(stream_id)
            if stream is not None:
                stream.deliver({"type": "stream.window", "increment": peer_wire.parse_window(payload)})
        elif kind == peer_wire.END:
            stream = self._streams.pop(stream_id, None)
            if stream is not None:
                stream.deliver({"type": "stream.end", "error": payload.decode(errors="replace")})
        elif kind in (peer_wire.OPENED, peer_wire.NOT_HERE):
            answer = self._answers.pop(stream_id, None)
            if answer is not None and not answer.done():
                answer.set_result(kind)
        elif kind == peer_wire.CHALLENGE and not self._ready.done():
            listener_nonce = peer_wire.check_challenge(self._key, self._nonce, payload)
            link.send(peer_wire.proof_frame(self._key, self._nonce, listener_nonce))
            self._ready.set_result(None)
        else:
            raise peer_wire.PeerProtocolError(f"frame kind {kind} is not for the opening side")

    def link_lost(self, link: PeerLink, reason: str) -> None:
        self._lose(reason)

    def _lose(self, reason: str) -> None:
        if self.lost:
            return
        self.lost = reason
        self._pool.discard(self)
        if not self._ready.done():
            self._ready.set_exception(PeerUnreachable(reason))
            self._ready.exception()  # (retrieved: waiters re-raise it)
        answers, self._answers = self._answers, {}
        for answer in answers.values():
            if not answer.done():
                answer.set_exception(PeerUnreachable(reason))
        # (a stream still waiting for its answer hears it through the answer: its open fails)
        streams = {sid: stream for sid, stream in self._streams.items() if sid not in answers}
        self._streams = {}
        if streams:
            log.warning("peer link to %s lost (%s): ending its %d stream(s)", self.address, reason, len(streams))
        for stream in streams.values():
            stream.deliver({"type": "stream.end", "error": f"peer link to {self.address} lost: {reason}"})
        if self._link is not None:
            self._link.close(reason)


class PeerLinks:
    """One event loop's links, one per peer address."""

    def __init__(self) -> None:
        self._links: dict[str, DialedLink] = {}

    async def link_to(self, address: str) -> DialedLink:
        """The authenticated link to `address`, dialed if there is none; `PeerUnreachable` otherwise."""
        dialed = self._links.get(address)
        if dialed is None or not dialed.usable:
            dialed = self._links[address] = DialedLink(address, self)
            dialed.dial()
        try:
            await dialed.ready()
        except TimeoutError:
            dialed._lose("no handshake in time")
            raise PeerUnreachable(f"peer {address} did not complete the handshake in time") from None
        return dialed

    def discard(self, dialed: DialedLink) -> None:
        if self._links.get(dialed.address) is dialed:
            del self._links[dialed.address]

    def close_all(self) -> None:
        """Drop every link (tests, shutdown)."""
        for dialed in list(self._links.values()):
            dialed._lose("closed by this process")


_pools: dict[asyncio.AbstractEventLoop, PeerLinks] = {}


def links() -> PeerLinks:
    """This event loop's links (a link belongs to the loop that dialed it)."""
    loop = asyncio.get_running_loop()
    pool = _pools.get(loop)
    if pool is None:
        for old in [old for old in _pools if old.is_closed()]:
            del _pools[old]
        pool = _pools[loop] = PeerLinks()
    return pool

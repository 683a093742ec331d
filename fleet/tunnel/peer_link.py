"""One peer link: a TCP connection between two control-plane processes carrying many streams.

Both ends use it (`fleet.tunnel.peer_listener` accepts links, `fleet.proxy.peer_dialer` opens them); what a
frame means is the business of the link's `LinkHandler`. Here: cutting the bytes into frames
(`peer_wire.FrameReader`), coalescing writes (every frame queued during one turn of the event loop
goes out in one write, so 256 streams each sending a token cost one syscall, not 256), and supervision:
a failure while reading, handling or writing is logged, the link is dropped, and the handler hears it
lost (it ends the link's streams with an error). Nothing on the link ever fails silently.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol, cast

from fleet.tunnel import peer_wire

log = logging.getLogger("fleet.tunnel.peers")


class LinkHandler(Protocol):
    """What a link tells the side that owns it."""

    def frame_received(self, link: PeerLink, kind: int, stream_id: int, payload: bytes) -> None: ...

    def link_lost(self, link: PeerLink, reason: str) -> None: ...


class PeerLinkClosed(Exception):
    """A frame was sent on a link that is gone."""


class PeerLink(asyncio.Protocol):
    """The frames of one connection; `send` queues, the loop's next turn writes them all at once."""

    def __init__(self, handler: LinkHandler, name: str = "") -> None:
        self.handler = handler
        self.name = name  # the other end, for logs
        self.closed = False
        self._transport: asyncio.Transport | None = None
        self._reader = peer_wire.FrameReader()
        self._out: list[bytes] = []
        self._flush_due = False
        self._reason = ""

    @property
    def dropped_here(self) -> bool:
        """Whether this end dropped the link (`close`), rather than the other end or the network."""
        return bool(self._reason)

    def limit_payload(self, size: int) -> None:
        """Refuse frames announcing a payload over `size` bytes from now on (the link is dropped)."""
        self._reader.max_payload = size

    # ---- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # (uvloop's transports do not subclass it)
        if not self.name:
            peer = transport.get_extra_info("peername")
            self.name = peer_wire.format_address(*peer[:2]) if peer else "?"

    def data_received(self, data: bytes) -> None:
        try:
            for kind, stream_id, payload in self._reader.frames(data):
                if self.closed:
                    return
                self.handler.frame_received(self, kind, stream_id, payload)
        except peer_wire.PeerProtocolError as exc:
            log.warning("peer link %s: %s; dropping it", self.name, exc)
            self.close(str(exc))
        except Exception as exc:
            log.exception("peer link %s: handling a frame failed; dropping the link", self.name)
            self.close(f"handling a frame failed: {exc!r}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._out.clear()
        reason = self._reason or (f"connection lost: {exc}" if exc else "connection closed by the peer")
        try:
            self.handler.link_lost(self, reason)
        except Exception:
            log.exception("peer link %s: ending its streams failed", self.name)

    # ---- sending

    def send(self, *parts: bytes) -> None:
        """Queue a frame (its parts: header, payload) for this turn's write; `PeerLinkClosed` if gone."""
        if self.closed:
            raise PeerLinkClosed(self._reason or f"peer link {self.name} closed")
        self._out.extend(parts)
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        if self.closed or not self._out or self._transport is None:
            return
        out, self._out = self._out, []
        try:
            self._transport.write(b"".join(out))
        except Exception as exc:
            log.exception("peer link %s: writing failed; dropping the link", self.name)
            self.close(f"writing failed: {exc!r}")

    def close(self, reason: str) -> None:
        """Drop the link (what is queued is lost); the handler hears `link_lost` with `reason`."""
        if self.closed:
            return
        self._reason = reason
        self.closed = True
        if self._transport is not None:
            self._transport.abort()  # connection_lost follows on the loop's next turn

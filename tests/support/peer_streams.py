"""Streams opened over a real peer link to this process's own listener, for tests of the holding side.

The test process holds the tunnel (a channels communicator or a stand-in `LocalTunnel`) and also plays
the other process: it dials its own peer listener, as another web process would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fleet.proxy import peer_dialer
from fleet.tunnel import peer_listener, peer_wire


class Collector:
    """A stream's messages as the opening side receives them (a `peer_dialer.PeerStream`)."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._changed = asyncio.Event()

    def deliver(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        self._changed.set()

    def data(self) -> bytes:
        return b"".join(m["data"] for m in self.messages if m["type"] == "stream.data")

    async def until(self, done: Callable[[Collector], bool], timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while not done(self):
                self._changed.clear()
                await self._changed.wait()

    def ended(self) -> dict[str, Any] | None:
        return next((m for m in self.messages if m["type"] == "stream.end"), None)


async def link_to_self() -> peer_dialer.DialedLink:
    """A link from this process to its own peer listener (started if needed)."""
    return await peer_dialer.links().link_to(await peer_listener.address())


async def open_over_link(
    node_id: Any, stream_id: int, *, port: int = 8000, host: str = "", window: int = 4096, data: bytes = b""
) -> tuple[peer_dialer.DialedLink, Collector, bool]:
    """Open a stream to `node_id` over a link to this process: (link, what arrives, whether OPENED)."""
    link = await link_to_self()
    collector = Collector()
    opening = peer_wire.Opening(str(node_id), port, host, window, data, False)
    opened = await link.open(stream_id, collector, opening, timeout=5)
    return link, collector, opened

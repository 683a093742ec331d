"""Where a node's tunnel is held: the peer address its process recorded (`Node.tunnel_peer`), cached.

A tunnel writes its process's peer address on its node row when it connects (in the same update as
`tunnel_inbox`) and clears it when it closes. A proxying process keeps what it read for
PEER_ROUTE_CACHE_S; an answer that proves it stale (NOT_HERE, a peer that cannot be dialed) makes the
opener `forget` it and read again. Concurrent misses for one node share one query.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from channels.db import DatabaseSyncToAsync

from fleet.models import Node

PEER_ROUTE_CACHE_S = 10.0

_routes: dict[str, tuple[str, float]] = {}  # node id → (peer address, until)
_reads: dict[str, asyncio.Future[str]] = {}  # node id → the query in flight


def _read(node_id: str) -> str:
    row = Node.objects.filter(pk=node_id, connected=True).values_list("tunnel_peer", flat=True).first()
    return row or ""


_read_async = DatabaseSyncToAsync(_read, thread_sensitive=False)


async def peer_of(node_id: Any) -> str:
    """The peer address of the process holding `node_id`'s tunnel; "" when none is recorded."""
    key = str(node_id)
    cached = _routes.get(key)
    if cached is not None and cached[1] > time.monotonic():
        return cached[0]
    loop = asyncio.get_running_loop()
    reading = _reads.get(key)
    if reading is None or reading.get_loop() is not loop:
        reading = _reads[key] = asyncio.ensure_future(_read_async(key))
        reading.add_done_callback(lambda _: _reads.pop(key, None) if _reads.get(key) is reading else None)
    address = await asyncio.shield(reading)
    if address:
        _routes[key] = (address, time.monotonic() + PEER_ROUTE_CACHE_S)
    return address


def forget(node_id: Any, address: str = "") -> None:
    """Drop the cached address of `node_id` (only if it still is `address`, when given)."""
    key = str(node_id)
    cached = _routes.get(key)
    if cached is not None and (not address or cached[0] == address):
        del _routes[key]


def forget_all() -> None:
    _routes.clear()

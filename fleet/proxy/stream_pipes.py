"""What flows back to a proxying process from a tunnel held by another replica: plain Redis lists.

A cross-replica stream used to send every response chunk through the Channels layer, which costs four
sequential Redis round trips per send (expiry sweep, capacity count, ZADD into a sorted set, EXPIRE),
msgpack, and on the receiving side a Lua clean-up script, a BZPOPMIN and a backup copy of each message.
For bulk bytes that made the other replica ~5x slower per GB than the replica holding the tunnel.

Here each stream has one Redis list (`new_pipe_key`). The tunnel consumer appends without waiting
(`PipeWriter`: whatever queued up during one round trip goes in the next RPUSH + EXPIRE); the
proxying process pops with BLPOP and takes what else is there with one LPOP. Messages are the same
dicts the local path hands over (`stream.opened`, `stream.data`, `stream.window`, `stream.end`),
encoded as one type byte plus a raw payload: no serialisation of the body bytes. The list never holds
more than the stream's window (credit-based flow control), and it expires if its reader vanished.
Messages *to* the tunnel (request bytes, credit, aborts) still go through the Channels layer to the
consumer's channel.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import struct
from typing import Any

import redis.asyncio as aioredis
from django.conf import settings

log = logging.getLogger("fleet.proxy")

KEY_PREFIX = "cleverthis:stream:"
# A list nobody reads (its proxying process died) disappears after this long without a push.
PIPE_TTL_S = 120
# Redis connections a process may use for pipes; a stream waiting for its response holds one.
MAX_CONNECTIONS = 1000

_OPENED, _DATA, _WINDOW, _END = b"O", b"D", b"W", b"E"
_INCREMENT = struct.Struct("!Q")

_clients: dict[asyncio.AbstractEventLoop, aioredis.Redis] = {}
_flushes: set[asyncio.Task[None]] = set()  # running flushes (a writer may be dropped before its flush ends)


def new_pipe_key() -> str:
    """A fresh, unguessable list key for one stream."""
    return KEY_PREFIX + secrets.token_hex(16)


def _client() -> aioredis.Redis:
    """This event loop's client (redis-py's asyncio connections belong to the loop that made them)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        for old_loop in [old for old in _clients if old.is_closed()]:
            del _clients[old_loop]
        pool = aioredis.BlockingConnectionPool.from_url(
            settings.REDIS_URL, max_connections=MAX_CONNECTIONS, timeout=30, socket_timeout=30
        )
        client = _clients[loop] = aioredis.Redis(connection_pool=pool)
    return client


def encode(message: dict[str, Any]) -> bytes:
    """One stream message as bytes: a type byte, then the body bytes / increment / text as they are."""
    kind = message["type"]
    if kind == "stream.data":
        return _DATA + bytes(message["data"])
    if kind == "stream.window":
        return _WINDOW + _INCREMENT.pack(int(message["increment"]))
    if kind == "stream.end":
        return _END + message.get("error", "").encode()
    if kind == "stream.opened":
        return _OPENED + message["consumer"].encode()
    raise ValueError(f"not a stream message: {kind}")


def decode(raw: bytes) -> dict[str, Any]:
    kind, payload = raw[:1], raw[1:]
    if kind == _DATA:
        return {"type": "stream.data", "data": payload}
    if kind == _WINDOW:
        return {"type": "stream.window", "increment": _INCREMENT.unpack(payload)[0]}
    if kind == _END:
        return {"type": "stream.end", "error": payload.decode(errors="replace")}
    if kind == _OPENED:
        return {"type": "stream.opened", "consumer": payload.decode()}
    raise ValueError(f"unknown stream message type {kind!r}")


class PipeWriter:
    """The tunnel side of one pipe: `send` never waits; a background flush appends what queued up.

    The consumer hands messages over in order and goes on with the next frame at once (a heartbeat
    never waits behind a Redis round trip); the flush task pushes everything queued meanwhile with one
    RPUSH. The queue is bounded by the stream's window, since the agent sends no more than that.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        self._queue: list[bytes] = []
        self._flushing: asyncio.Task[None] | None = None

    def send(self, message: dict[str, Any]) -> None:
        self._queue.append(encode(message))
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.ensure_future(self._flush())
            _flushes.add(self._flushing)
            self._flushing.add_done_callback(_flushes.discard)

    async def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                async with _client().pipeline(transaction=False) as pipe:
                    pipe.rpush(self.key, *batch)
                    pipe.expire(self.key, PIPE_TTL_S)
                    await pipe.execute()
            except Exception:  # Redis away: the reader times out and the client gets a 504 or a cut body
                log.exception("stream pipe %s: push failed; %d message(s) dropped", self.key, len(batch))
                return

    async def drained(self) -> None:
        """Wait until everything sent so far reached Redis (tests, shutdown)."""
        while self._flushing is not None and not self._flushing.done():
            await asyncio.shield(self._flushing)


async def pop(key: str, timeout: float, *, most: int = 64) -> list[dict[str, Any]]:
    """The next messages of the pipe, oldest first: waits up to `timeout` s for one ([] if none came),
    then takes up to `most` - 1 more that are already there."""
    client = _client()
    answer = await client.blpop([key], timeout=max(timeout, 0.01))
    if answer is None:
        return []
    raws = [answer[1]]
    if most > 1:
        raws += await client.lpop(key, most - 1) or []
    return [decode(raw) for raw in raws]


async def remove(key: str) -> None:
    """Drop the pipe and whatever is left in it (the stream is over)."""
    await _client().delete(key)

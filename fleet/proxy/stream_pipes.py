"""What flows back to a proxying process from a tunnel held by another replica: plain Redis lists.

A cross-replica stream used to send every response chunk through the Channels layer, which costs four
sequential Redis round trips per send (expiry sweep, capacity count, ZADD into a sorted set, EXPIRE),
msgpack, and on the receiving side a Lua clean-up script, a BZPOPMIN and a backup copy of each message.
For bulk bytes that made the other replica ~5x slower per GB than the replica holding the tunnel.

Here each stream has one Redis list (`new_pipe_key`). The tunnel consumer appends without waiting
(`PipeWriter`, the sink `fleet.proxy.wiring` offers the tunnel): whatever all the streams of this
process queued up during one round trip goes in the next pipeline, an RPUSH + EXPIRE per stream, so
hundreds of streams each sending a token cost one round trip, not one each. The proxying process pops
with one BLMPOP (what is there, up to a count; BLPOP then LPOP on a Redis older than 7). Messages are
the same dicts the local path hands over (`stream.opened`, `stream.data`, `stream.window`, `stream.end`),
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
from redis.exceptions import ResponseError

log = logging.getLogger("fleet.proxy")

KEY_PREFIX = "cleverthis:stream:"
# A list nobody reads (its proxying process died) disappears after this long without a push.
PIPE_TTL_S = 120
# Redis connections a process may use for pipes; a stream waiting for its response holds one.
MAX_CONNECTIONS = 1000

_OPENED, _DATA, _WINDOW, _END = b"O", b"D", b"W", b"E"
_INCREMENT = struct.Struct("!Q")

_clients: dict[asyncio.AbstractEventLoop, aioredis.Redis] = {}
_flushers: dict[asyncio.AbstractEventLoop, _Flusher] = {}
_blmpop = {"supported": True}  # False once Redis said it has no BLMPOP (older than 7)


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
    """The tunnel side of one pipe, a `fleet.tunnel.streams_seam.StreamSink`: `deliver` never waits; this
    loop's `_Flusher` appends what queued up.

    The consumer hands messages over in order and goes on with the next frame at once (a heartbeat
    never waits behind a Redis round trip). The queue is bounded by the stream's window, since the
    agent sends no more than that.
    """

    def __init__(self, key: str) -> None:
        self.key = key
        self._queue: list[bytes] = []
        self._flusher: _Flusher | None = None

    def deliver(self, message: dict[str, Any]) -> None:
        self._queue.append(encode(message))
        if self._flusher is None:
            self._flusher = _flusher()
        self._flusher.add(self)

    def take(self) -> list[bytes]:
        """What queued up since the last flush (for the flusher)."""
        batch, self._queue = self._queue, []
        return batch

    async def drained(self) -> None:
        """Wait until everything sent so far reached Redis (tests, shutdown)."""
        while self._flusher is not None and self._flusher.holds(self):
            await self._flusher.round()


class _Flusher:
    """One event loop's pipe writes: the messages every writer queued meanwhile, in one pipeline.

    One pipeline runs at a time, so each pipe's messages reach Redis in the order they were sent.
    """

    def __init__(self) -> None:
        self._pending: dict[PipeWriter, None] = {}  # writers with queued messages, in order
        self._flushing: set[PipeWriter] = set()
        self._task: asyncio.Task[None] | None = None
        self._done = asyncio.Event()

    def add(self, writer: PipeWriter) -> None:
        self._pending[writer] = None
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())

    def holds(self, writer: PipeWriter) -> bool:
        """Whether `writer` has messages queued or on their way to Redis."""
        running = self._task is not None and not self._task.done()
        return running and (writer in self._pending or writer in self._flushing)

    async def round(self) -> None:
        """Wait for the pipeline in flight (or the next one) to end."""
        self._done.clear()
        await self._done.wait()

    async def _run(self) -> None:
        try:
            while self._pending:
                writers, self._pending = list(self._pending), {}
                self._flushing = set(writers)
                await self._push([(writer.key, writer.take()) for writer in writers])
                self._flushing = set()
                self._done.set()
        finally:
            self._flushing = set()
            self._done.set()

    @staticmethod
    async def _push(batch: list[tuple[str, list[bytes]]]) -> None:
        try:
            async with _client().pipeline(transaction=False) as pipe:
                for key, messages in batch:
                    pipe.rpush(key, *messages)
                    pipe.expire(key, PIPE_TTL_S)
                results = await pipe.execute(raise_on_error=False)
        except Exception:  # Redis away: the readers time out and the clients get a 504 or a cut body
            log.exception("stream pipes: push failed; %d pipe(s) lost messages", len(batch))
            return
        for (key, messages), result in zip(batch, results[::2], strict=True):
            if isinstance(result, Exception):
                log.error("stream pipe %s: push failed (%s); %d message(s) dropped", key, result, len(messages))


def _flusher() -> _Flusher:
    loop = asyncio.get_running_loop()
    flusher = _flushers.get(loop)
    if flusher is None:
        for old_loop in [old for old in _flushers if old.is_closed()]:
            del _flushers[old_loop]
        flusher = _flushers[loop] = _Flusher()
    return flusher


async def pop(key: str, timeout: float, *, most: int = 64) -> list[dict[str, Any]]:
    """The next messages of the pipe, oldest first: waits up to `timeout` s for one ([] if none came),
    then takes up to `most` - 1 more that are already there."""
    client = _client()
    timeout = max(timeout, 0.01)
    if _blmpop["supported"]:
        try:
            answer = await client.blmpop(timeout, 1, key, direction="LEFT", count=most)
        except ResponseError as exc:
            if "unknown command" not in str(exc).lower():
                raise
            _blmpop["supported"] = False
        else:
            return [decode(raw) for raw in answer[1]] if answer else []
    popped = await client.blpop([key], timeout=timeout)
    if popped is None:
        return []
    raws = [popped[1]]
    if most > 1:
        raws += await client.lpop(key, most - 1) or []
    return [decode(raw) for raw in raws]


async def remove(key: str) -> None:
    """Drop the pipe and whatever is left in it (the stream is over)."""
    await _client().delete(key)

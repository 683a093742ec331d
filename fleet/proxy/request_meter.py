"""Requests and latency of proxied endpoints, per workspace and minute, for the home page's charts.

A resolver that wants its requests counted names a series in `ProxyTarget.meter` (the endpoint
resolver names the endpoint's workspace, `kernel.timeseries.workspace_series`). The relay runs the
request through `metered`, which notes the response's status and its time to first byte (the head
from the node; an answer of the proxy itself, such as 502, counts too) in this process's memory. At
most every ENDPOINT_REQUESTS_FLUSH_S a thread adds what was noted to Redis in one call, so a burst of
requests costs no Redis write each and never blocks the event loop; a process that dies loses at most
that interval's counts (telemetry).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

from kernel import timeseries

log = logging.getLogger(__name__)

_pending: dict[tuple[str, int], list[float]] = {}  # (series, minute) → [requests, errors, ms sum, ms max]
_flush_handle: asyncio.TimerHandle | None = None  # the flush scheduled, if any
_flush_loop: asyncio.AbstractEventLoop | None = None  # the loop it is scheduled on (a loop that ended never runs it)


class MeteredSend:
    """An ASGI `send` that notes the response's status and when its head went out.

    `__wrapped__` is the server's own send (`WritePressure.of` looks through to it).
    """

    def __init__(self, send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        self.__wrapped__ = send
        self.status = 0
        self.head_at: float | None = None

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and self.head_at is None:
            self.status = int(message["status"])
            self.head_at = time.monotonic()
        await self.__wrapped__(message)


def after_head(send: Any) -> Any:
    """The `send` for a response's body once its head went out: a `MeteredSend` has noted all it notes
    by then, so the body's messages (one per streamed token) go to the server's send directly."""
    if isinstance(send, MeteredSend) and send.head_at is not None:
        return send.__wrapped__
    return send


def observe(series: str, status: int, seconds: float, *, now: float | None = None) -> None:
    """Note one request (status 0: no answer reached the client) and schedule the flush if none is."""
    key = (series, timeseries.minute_of(now if now is not None else time.time()))
    counts = _pending.setdefault(key, [0, 0, 0.0, 0.0])
    ms = max(seconds, 0.0) * 1000.0
    counts[0] += 1
    counts[1] += 1 if status >= 500 or status == 0 else 0
    counts[2] += ms
    counts[3] = max(counts[3], ms)
    _schedule_flush()


def _schedule_flush() -> None:
    global _flush_handle, _flush_loop
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no loop (a sync caller): write now
        flush()
        return
    if _flush_handle is not None and _flush_loop is loop:
        return  # one is due on this loop
    _flush_loop = loop
    _flush_handle = loop.call_later(settings.ENDPOINT_REQUESTS_FLUSH_S, _flush_in_thread, loop)


def _flush_in_thread(loop: asyncio.AbstractEventLoop) -> None:
    global _flush_handle
    _flush_handle = None
    loop.run_in_executor(None, flush)


def flush() -> int:
    """Add the noted requests to Redis (one call); returns how many (series, minute) buckets it wrote."""
    taken = list(_pending.items())
    for key, _ in taken:
        _pending.pop(key, None)
    if not taken:
        return 0
    writes: list[timeseries.Write] = []
    for (series, minute), (requests, errors, ms_sum, ms_max) in taken:
        at = minute * timeseries.STEP_S
        writes += [
            timeseries.Write(series, "ep.requests", requests, "add", at),
            timeseries.Write(series, "ep.errors", errors, "add", at),
            timeseries.Write(series, "ep.latency_ms_sum", round(ms_sum, 1), "add", at),
            timeseries.Write(series, "ep.latency_ms_max", round(ms_max, 1), "max", at),
        ]
    timeseries.record(writes)
    return len(taken)


async def metered(series: str, send: Any, run: Callable[[Any], Awaitable[None]]) -> None:
    """Run `run(send)` (a proxied request); with a `series`, count it there with its status and latency."""
    if not series:
        await run(send)
        return
    watched = MeteredSend(send)
    started = time.monotonic()
    try:
        await run(watched)
    finally:
        end = watched.head_at if watched.head_at is not None else time.monotonic()
        observe(series, watched.status, end - started)

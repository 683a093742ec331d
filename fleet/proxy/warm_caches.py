"""The proxy's per-process copies (API keys' rights, endpoints' routes, budgets' stops) re-read before they go
stale, off the request path.

Each copy is trusted for a short time (API_KEY_CACHE_S 0.5 s, PROXY_ROUTE_CACHE_S 2 s, BUDGET_STOPS_CACHE_S
5 s): that time is the product's promise of how soon a revocation, a route change or a budget stop is in
force everywhere. Read on demand, a copy older than that costs the request that finds it a database query
(on a thread) or a Redis round trip before it is forwarded; a caller sending one request every second or
two (one chat user, a benchmark at concurrency 1) finds every copy stale and pays all of them, every time.

So the proxy notes what each request used (`used`: a dict write), and one loop per process (`REFRESHER`,
started by the proxy's first request) re-reads, every quarter of the shortest of those times, whatever was
used within PROXY_KEEP_WARM_S and is past half its time: the keys in one query, each route with its usual
queries, the stops with one HGETALL. Requests then find their copies fresh, and each copy is still never
older than its time (a refresh counts its age from before its read), so every promise holds unchanged.
With nothing used for PROXY_KEEP_WARM_S the loop reads nothing (0: no loop; copies are read on demand).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from channels.db import database_sync_to_async
from django.conf import settings

log = logging.getLogger(__name__)

_USED_MAX = 10_000


@dataclass
class Warmed:
    """One kind of copy kept warm: how long a copy is trusted (`ttl_s`), how old one is now (`age_s`, None
    when it is not cached), and how to re-read several (`reload`: sync, run on a thread; or `reload_async`)."""

    name: str
    ttl_s: Callable[[], float]
    age_s: Callable[[str], float | None]
    reload: Callable[[list[str]], None] | None = None
    reload_async: Callable[[list[str]], Awaitable[None]] | None = None
    used: dict[str, float] = field(default_factory=dict)  # what requests used → when last (monotonic)

    def due(self, now: float) -> list[str]:
        """What was used within PROXY_KEEP_WARM_S and is cached but past half its time (forgets the rest)."""
        keep = settings.PROXY_KEEP_WARM_S
        half = self.ttl_s() / 2
        found = []
        for name, at in list(self.used.items()):
            if now - at > keep:
                del self.used[name]
                continue
            age = self.age_s(name)
            if age is not None and age >= half:
                found.append(name)
        return found


_kinds: dict[str, Warmed] = {}


def register(kind: Warmed) -> Warmed:
    """Keep copies of `kind` warm (its module registers it once, at import)."""
    _kinds[kind.name] = kind
    return kind


def used(kind: Warmed, name: str) -> None:
    """A request used the copy `name` of `kind` (keeps it warm for PROXY_KEEP_WARM_S); starts the loop."""
    if settings.PROXY_KEEP_WARM_S <= 0 or kind.ttl_s() <= 0:
        return
    if len(kind.used) >= _USED_MAX:
        kind.used.clear()
    kind.used[name] = time.monotonic()
    REFRESHER.ensure_running()


class Refresher:
    """The loop re-reading due copies, one per process (on the event loop that serves the requests)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    def ensure_running(self) -> None:
        """Start the loop on the running event loop unless it runs there already."""
        loop = asyncio.get_running_loop()
        if self._loop is loop and self._task is not None and not self._task.done():
            return
        self._loop = loop
        self._task = loop.create_task(self.run(), name="proxy-warm-caches")
        self._task.add_done_callback(_say_if_ended)

    async def run(self) -> None:
        """Refresh due copies every quarter of the shortest time; end once nothing was used for a while."""
        while True:
            ttls = [kind.ttl_s() for kind in _kinds.values() if kind.ttl_s() > 0]
            await asyncio.sleep(min(ttls, default=1.0) / 4)
            if not await self.refresh_once():
                return

    async def refresh_once(self) -> bool:
        """Re-read every due copy; whether anything is still kept warm (a failed read is logged, kept for
        the next pass)."""
        now = time.monotonic()
        anything = False
        for kind in list(_kinds.values()):
            names = kind.due(now)
            anything = anything or bool(kind.used)
            if not names:
                continue
            try:
                if kind.reload is not None:
                    # on the sync thread, as the saves whose signals forget a copy: a re-read can never
                    # interleave with a save and put back what was read before it
                    await database_sync_to_async(kind.reload)(names)
                if kind.reload_async is not None:
                    await kind.reload_async(names)
            except Exception:  # the copies are read on demand meanwhile
                log.warning("re-reading %s %s failed", len(names), kind.name, exc_info=True)
        return anything


def _say_if_ended(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("proxy cache refresher ended", exc_info=task.exception())


REFRESHER = Refresher()

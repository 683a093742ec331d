"""Whether this process is draining: asked to stop, it leaves the load balancer before it stops serving.

A web process that is asked to stop (SIGTERM under uvicorn: `cleverthis.graceful`) first *drains*:
`/healthz` answers 503 at once, so the load balancer (HAProxy's checks, a Kubernetes readiness probe)
sends it nothing new, and new agent tunnels are refused; then each hook registered with `on_drain` runs
(the tunnel moves its agents to another replica, `fleet.tunnel.drain`) until it is done or the drain
deadline (`WEB_DRAIN_DEADLINE_S`) passes. Only then does the server stop accepting and close what is left.

One state per process, read without a lock (it only ever goes from not draining to draining).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("kernel.draining")

DrainHook = Callable[[float], Awaitable[None]]

_state: dict[str, float | None] = {"since": None, "deadline": None}
_hooks: list[DrainHook] = []


def is_draining() -> bool:
    """True once this process began to drain."""
    return _state["since"] is not None


def deadline() -> float | None:
    """The drain deadline (`time.monotonic()`), or None while not draining."""
    return _state["deadline"]


def on_drain(hook: DrainHook) -> None:
    """Run `await hook(deadline)` when this process drains (once per hook; registering twice is a no-op).

    The hook returns when its part of the drain is done; it is cancelled at the deadline."""
    if hook not in _hooks:
        _hooks.append(hook)


def begin(deadline_s: float) -> bool:
    """Mark this process draining, its deadline `deadline_s` from now; False if it already was."""
    if is_draining():
        return False
    now = time.monotonic()
    _state.update(since=now, deadline=now + max(0.0, deadline_s))
    return True


async def drain(deadline_s: float, *, settle_s: float = 0.0) -> None:
    """Begin draining (if not yet); after `settle_s` (for the load balancer to see the failing health,
    within the deadline) run every hook until all are done or the deadline passes."""
    begin(deadline_s)
    end = _state["deadline"]
    since = _state["since"]
    assert end is not None
    assert since is not None
    await asyncio.sleep(max(0.0, min(since + settle_s, end) - time.monotonic()))
    tasks = [asyncio.ensure_future(hook(end)) for hook in list(_hooks)]
    if not tasks:
        return
    done, pending = await asyncio.wait(tasks, timeout=max(0.0, end - time.monotonic()))
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            log.error("a drain hook failed", exc_info=task.exception())
    if pending:
        log.warning("drain deadline reached with %d hook(s) unfinished", len(pending))


def reset() -> None:
    """Forget the drain state (tests only: a real process never stops draining)."""
    _state.update(since=None, deadline=None)

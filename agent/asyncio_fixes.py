"""Cancellation that always arrives: `asyncio.wait_for` without Python 3.11's lost cancel, and `cancel_and_wait`.

On Python 3.11 `asyncio.wait_for` runs its awaitable as a task of its own. When the caller is cancelled
in the moment after that task finished and before the caller resumed, it returns the task's result
instead of raising `CancelledError`: the cancellation is lost (CPython gh-86296; 3.12 rewrote
`wait_for` on `asyncio.timeout`, gh-96764). redis-py's asyncio client writes every command through
`wait_for` when a socket timeout is set (the channel layer's is 30 s), and channels_redis's `receive()`
loops on a blocking pop until a message comes: a cancel that landed just after a command was written
left a tunnel consumer's channel reader, or this process's tunnel inbox reader, running for good, and an
event loop whose shutdown (cancel every task, wait for them all) never ended.

`install()` replaces `asyncio.wait_for` with 3.12's version on Python < 3.12 (nothing to do on 3.12+);
libraries look it up on the `asyncio` module when they call it, so it applies to them too. The control
plane installs it when Django starts (`fleet.apps`), the agent when it starts (`agent.__main__`).
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


def _release(waiter: asyncio.Future[None], *_: Any) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _cancel_and_wait_for_end(fut: asyncio.Future[Any]) -> None:
    waiter = asyncio.get_running_loop().create_future()
    release = functools.partial(_release, waiter)
    fut.add_done_callback(release)
    try:
        fut.cancel()
        await waiter
    finally:
        fut.remove_done_callback(release)


async def wait_for(fut: Awaitable[T], timeout: float | None) -> T:
    """`asyncio.wait_for` as in Python 3.12: the awaitable runs in the caller's task under `asyncio.timeout`,
    so a cancellation of the caller always propagates (a timeout raises `TimeoutError`, as before)."""
    if timeout is not None and timeout <= 0:
        task = asyncio.ensure_future(fut)
        if task.done():
            return task.result()
        await _cancel_and_wait_for_end(task)
        try:
            return task.result()
        except asyncio.CancelledError as exc:
            raise TimeoutError from exc
    async with asyncio.timeout(timeout):
        return await fut


def install() -> None:
    """Make `asyncio.wait_for` pass every cancellation on (Python < 3.12; idempotent)."""
    if sys.version_info < (3, 12):
        asyncio.wait_for = wait_for  # type: ignore[assignment]
        asyncio.tasks.wait_for = wait_for  # type: ignore[assignment]


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel `tasks` and wait until all have ended, without swallowing a cancellation of the caller.

    `task.cancel(); with suppress(CancelledError): await task` loses the caller's own cancel when it
    arrives during the await; `asyncio.wait` raises it instead. The tasks' outcomes are marked as
    retrieved (a task that failed while being cancelled is not reported again when garbage-collected).
    """
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    await asyncio.wait(set(tasks))
    for task in tasks:
        if not task.cancelled():
            task.exception()

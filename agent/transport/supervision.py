"""Supervision of the agent's long-lived tasks: none of them may die silently.

`Supervisor` owns the tasks of one tunnel session (frame sender, heartbeats, endpoint health probes). A
task that raises an unexpected exception is logged once, with its traceback, and then either restarted
after a short, growing delay (`restart=True`: heartbeats must go on) or the whole session is failed: `watch` raises
`TaskFailed`, the socket closes and the agent reconnects cleanly, re-sending its hello and inventory.
Cancellation is never a failure. Any other task can fail the session the same way with `fail`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from agent.asyncio_fixes import cancel_and_wait

log = logging.getLogger("agent.supervision")

T = TypeVar("T")


class TaskFailed(Exception):
    """A supervised task that may not restart failed; the session must end. Already logged."""

    def __init__(self, name: str, error: BaseException) -> None:
        super().__init__(f"{name} failed: {type(error).__name__}: {error}")
        self.name = name
        self.error = error


class Supervisor:
    """Runs and watches the long-lived tasks of one tunnel session."""

    def __init__(self, *, restart_delay_s: float = 1.0, max_restart_delay_s: float = 30.0) -> None:
        self.restart_delay_s = restart_delay_s
        self.max_restart_delay_s = max(max_restart_delay_s, restart_delay_s)
        self._tasks: set[asyncio.Task[None]] = set()
        self._failed: asyncio.Future[TaskFailed] = asyncio.get_running_loop().create_future()
        self.restarts = 0

    @property
    def failed(self) -> bool:
        return self._failed.done()

    def start(self, name: str, factory: Callable[[], Coroutine[Any, Any, None]], *, restart: bool = False) -> None:
        """Run `factory()` as task `name`; restart it after an unexpected exception, or fail the session."""
        task = asyncio.ensure_future(self._keep(name, factory, restart))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _keep(self, name: str, factory: Callable[[], Coroutine[Any, Any, None]], restart: bool) -> None:
        loop = asyncio.get_running_loop()
        delay = self.restart_delay_s
        while True:
            started = loop.time()
            try:
                await factory()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not restart:
                    self.fail(name, exc)
                    return
                if loop.time() - started > self.max_restart_delay_s:  # it ran fine for a while: start over
                    delay = self.restart_delay_s
                log.error("%s failed; restarting it in %.1fs", name, delay, exc_info=exc)
            self.restarts += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_restart_delay_s)

    def fail(self, name: str, error: BaseException) -> None:
        """`name` failed unexpectedly: log it once with its traceback and end the session."""
        if self._failed.done():
            log.error("%s failed too (the session is already ending)", name, exc_info=error)
            return
        log.error("%s failed; closing the tunnel to reconnect cleanly", name, exc_info=error)
        self._failed.set_result(TaskFailed(name, error))

    async def watch(self, main: Awaitable[T]) -> T:
        """Await `main` (the session's reader); raise `TaskFailed` as soon as a supervised task failed."""
        reader = asyncio.ensure_future(main)
        try:
            await asyncio.wait({reader, self._failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # a failed task, or the session itself cancelled: the reader goes too
            if not reader.done():
                await cancel_and_wait(reader)  # a cancel of the session itself still propagates
        if reader.cancelled():  # by us, for the failed task
            raise self._failed.result()
        return reader.result()  # the reader's own outcome comes first (e.g. revoked)

    async def stop(self) -> None:
        """Cancel every task and wait for them to end."""
        await cancel_and_wait(*self._tasks)  # a cancel of `stop` itself ends it (it is not swallowed)

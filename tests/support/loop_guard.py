"""A test's event loop that cannot shut down fails that test loudly instead of hanging the suite.

At the end of each async test pytest-asyncio's `asyncio.Runner` cancels every task left in the loop and
waits for all of them: one task that ignores or loses its cancellation used to hang there until the
300 s pytest timeout, with nothing saying which task. `cancel_all_tasks` waits at most `STUCK_S`, then
raises `TasksIgnoredCancellation` naming each task still running and where it waits (its whole chain of
awaits). It hides nothing: the test errors, the stuck tasks are abandoned with their loop, and the
process-wide channel layer, whose receive state such a task holds, is dropped so that later tests start
from a fresh one.
"""

from __future__ import annotations

import asyncio
import asyncio.runners
from typing import Any

# A cancelled task ends within milliseconds; this only bounds one that never does.
STUCK_S = 60.0


class TasksIgnoredCancellation(Exception):
    """Tasks still running `STUCK_S` after the loop's shutdown cancelled them.

    Not a RuntimeError: pytest-asyncio reports a RuntimeError raised by its runner's teardown as a warning.
    """


def await_chain(task: asyncio.Task[Any]) -> list[str]:
    """Where `task` waits: each coroutine of its chain of awaits, outermost first, as `file:line in name`."""
    lines = []
    coro: Any = task.get_coro()
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            lines.append(f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_qualname}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return lines


def cancel_all_tasks(loop: asyncio.AbstractEventLoop, bound_s: float | None = None) -> None:
    """`asyncio.runners._cancel_all_tasks`, waiting at most `bound_s` (default `STUCK_S`) for the tasks."""
    to_cancel = asyncio.all_tasks(loop)
    if not to_cancel:
        return
    for task in to_cancel:
        task.cancel()
    _, stuck = loop.run_until_complete(asyncio.wait(to_cancel, timeout=STUCK_S if bound_s is None else bound_s))
    if stuck:
        from channels.layers import channel_layers

        channel_layers.backends.clear()
        report = "\n".join(
            f"- {task.get_name()} ({task.get_coro().__qualname__}), waiting at:\n    "
            + "\n    ".join(await_chain(task))
            for task in sorted(stuck, key=lambda t: t.get_name())
        )
        raise TasksIgnoredCancellation(
            f"{len(stuck)} task(s) still running {bound_s or STUCK_S:.0f} s after the event loop's shutdown "
            f"cancelled them (a cancellation ignored or lost):\n{report}"
        )
    for task in to_cancel:
        if task.cancelled():
            continue
        if task.exception() is not None:
            loop.call_exception_handler(
                {
                    "message": "unhandled exception during asyncio.run() shutdown",
                    "exception": task.exception(),
                    "task": task,
                }
            )


def install() -> None:
    """Make every `asyncio.Runner` (pytest-asyncio's test loops) shut down through `cancel_all_tasks`."""
    if hasattr(asyncio.runners, "_cancel_all_tasks"):  # a private hook: a Python without it keeps its own
        asyncio.runners._cancel_all_tasks = cancel_all_tasks

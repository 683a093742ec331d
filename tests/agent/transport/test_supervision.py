"""The agent's task supervisor: a failing task is logged once with its traceback, then restarted or fatal."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agent.transport.supervision import Supervisor, TaskFailed

pytestmark = pytest.mark.asyncio


async def test_a_restartable_task_is_restarted_after_each_failure_and_each_is_logged_once(caplog):
    runs: list[int] = []

    async def beat() -> None:
        runs.append(len(runs))
        if len(runs) <= 2:
            raise RuntimeError(f"injected failure {len(runs)}")
        await asyncio.sleep(3600)

    supervisor = Supervisor(restart_delay_s=0.01, max_restart_delay_s=0.05)
    with caplog.at_level(logging.ERROR, logger="agent.supervision"):
        supervisor.start("heartbeats", beat, restart=True)
        async with asyncio.timeout(5):
            while len(runs) < 3:
                await asyncio.sleep(0.01)
    assert not supervisor.failed
    failures = [r for r in caplog.records if r.name == "agent.supervision"]
    assert [str(r.exc_info[1]) for r in failures] == ["injected failure 1", "injected failure 2"]
    assert all("heartbeats failed" in r.getMessage() for r in failures)
    await supervisor.stop()


async def test_a_fatal_task_failure_ends_the_watched_session_at_once(caplog):
    async def sender() -> None:
        await asyncio.sleep(0.05)
        raise TypeError("injected")

    async def reader() -> None:
        await asyncio.sleep(3600)

    supervisor = Supervisor()
    supervisor.start("frame sender", sender)
    with caplog.at_level(logging.ERROR, logger="agent.supervision"), pytest.raises(TaskFailed) as failed:
        async with asyncio.timeout(5):
            await supervisor.watch(reader())
    assert failed.value.name == "frame sender"
    assert isinstance(failed.value.error, TypeError)
    assert len([r for r in caplog.records if r.exc_info]) == 1
    await supervisor.stop()


async def test_the_readers_own_outcome_is_returned_or_raised_and_stop_cancels_the_rest():
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.sleep(3600)

    supervisor = Supervisor()
    supervisor.start("heartbeats", forever, restart=True)

    async def reader() -> str:
        await started.wait()
        return "closed"

    assert await supervisor.watch(reader()) == "closed"

    async def broken() -> None:
        raise KeyError("reader bug")

    with pytest.raises(KeyError):
        await supervisor.watch(broken())
    await supervisor.stop()
    assert not supervisor._tasks  # cancellation is not a failure and leaves nothing running
    assert not supervisor.failed


def _slow_to_end(release: asyncio.Event):
    """A task whose clean-up on cancel takes until `release` is set."""

    async def run() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await release.wait()

    return run


async def test_stop_cancelled_while_a_task_cleans_up_is_cancelled_not_finished():
    """A cancel of `stop` itself propagates (it used to be swallowed and `stop` returned as if done)."""
    release = asyncio.Event()
    supervisor = Supervisor()
    supervisor.start("slow", _slow_to_end(release))
    await asyncio.sleep(0)
    stopping = asyncio.ensure_future(supervisor.stop())
    for _ in range(3):
        await asyncio.sleep(0)
    assert not stopping.done()
    stopping.cancel()
    await asyncio.wait({stopping})
    assert stopping.cancelled()
    release.set()
    await supervisor.stop()


async def test_watch_cancelled_while_the_reader_cleans_up_is_cancelled_not_a_task_failure():
    """The session is cancelled while `watch` waits for its reader to end after a task failed: the cancel
    propagates (it used to be swallowed and turned into `TaskFailed`, and the agent reconnected)."""
    release = asyncio.Event()
    supervisor = Supervisor()
    watching = asyncio.ensure_future(supervisor.watch(_slow_to_end(release)()))
    await asyncio.sleep(0)
    supervisor.fail("sender", RuntimeError("injected"))
    for _ in range(3):
        await asyncio.sleep(0)
    assert not watching.done()  # waiting for the reader's clean-up
    watching.cancel()
    await asyncio.wait({watching})
    assert watching.cancelled()
    release.set()
    await supervisor.stop()

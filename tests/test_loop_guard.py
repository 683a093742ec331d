"""`tests.support.loop_guard`: a task that ignores its cancel fails the test loudly, named with where it waits."""

from __future__ import annotations

import asyncio

import pytest

from tests.support import loop_guard


async def _stubborn(stop: asyncio.Event) -> None:
    """Ignores every cancel until `stop` is set."""
    while not stop.is_set():
        try:
            await _deep()
        except asyncio.CancelledError:
            continue


async def _deep() -> None:
    await asyncio.sleep(3600)


async def _obedient() -> None:
    await asyncio.sleep(3600)


def test_a_task_that_ignores_its_cancel_is_reported_by_name_and_place_not_waited_for_forever():
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    try:
        stubborn = loop.create_task(_stubborn(stop), name="the-stubborn-one")
        obedient = loop.create_task(_obedient(), name="the-obedient-one")
        loop.run_until_complete(asyncio.sleep(0))
        with pytest.raises(loop_guard.TasksIgnoredCancellation) as raised:
            loop_guard.cancel_all_tasks(loop, bound_s=0.5)
        message = str(raised.value)
        assert "1 task(s) still running" in message
        assert "the-stubborn-one (_stubborn)" in message
        assert "in _deep" in message  # the whole chain of awaits, down to where it waits
        assert "the-obedient-one" not in message
        assert obedient.cancelled()
    finally:
        stop.set()
        stubborn.cancel()
        loop.run_until_complete(asyncio.wait({stubborn}))
        loop.close()


def test_tasks_that_end_on_cancel_pass_and_their_failures_reach_the_loop_handler():
    loop = asyncio.new_event_loop()
    reported: list[BaseException] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context["exception"]))

    async def fails_on_cancel() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise ValueError("clean-up failed") from None

    try:
        tasks = [loop.create_task(_obedient()), loop.create_task(fails_on_cancel())]
        loop.run_until_complete(asyncio.sleep(0))
        loop_guard.cancel_all_tasks(loop, bound_s=30)
        assert all(task.done() for task in tasks)
        assert [str(exc) for exc in reported] == ["clean-up failed"]
    finally:
        loop.close()


def test_the_guard_is_what_test_loops_shut_down_with():
    import asyncio.runners

    assert asyncio.runners._cancel_all_tasks is loop_guard.cancel_all_tasks

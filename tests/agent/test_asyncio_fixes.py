"""`agent.asyncio_fixes`: a cancellation is never lost, whatever moment it lands at.

Python 3.11's `asyncio.wait_for` returned its awaitable's result, instead of raising `CancelledError`,
when the caller was cancelled after that awaitable finished but before the caller resumed. Each test
cancels at every step of the event loop in turn, so one of the cancels lands in that window.
"""

from __future__ import annotations

import asyncio

import pytest

from agent import asyncio_fixes

pytestmark = pytest.mark.asyncio

STEPS = 8  # loop iterations to try a cancel at: the awaitable's whole life and then some


async def _outcome_of_a_cancel_after(steps: int, wait_for) -> str:
    """Cancel a task awaiting `wait_for(<an awaitable that takes two loop iterations>)` after `steps`
    iterations: "cancelled", "done before the cancel", or "lost" (it went on after being cancelled)."""

    async def quick() -> str:
        for _ in range(2):
            await asyncio.sleep(0)
        return "result"

    task = asyncio.ensure_future(wait_for(quick(), 10))
    for _ in range(1 + steps):  # the first step starts it
        await asyncio.sleep(0)
    if task.done():
        return "done before the cancel"
    task.cancel()
    await asyncio.wait({task})
    return "cancelled" if task.cancelled() else "lost"


async def test_wait_for_passes_on_a_cancel_at_any_step():
    outcomes = [await _outcome_of_a_cancel_after(steps, asyncio_fixes.wait_for) for steps in range(STEPS)]
    assert "lost" not in outcomes, outcomes
    assert outcomes[0] == "cancelled"  # the steps span its whole life
    assert outcomes[-1] == "done before the cancel"


async def test_the_installed_wait_for_is_the_one_that_passes_cancels_on():
    asyncio_fixes.install()
    outcomes = [await _outcome_of_a_cancel_after(steps, asyncio.wait_for) for steps in range(STEPS)]
    assert "lost" not in outcomes, outcomes
    assert outcomes[0] == "cancelled"
    assert outcomes[-1] == "done before the cancel"


async def test_wait_for_still_times_out_and_returns_results():
    assert await asyncio_fixes.wait_for(asyncio.sleep(0, result=7), 5) == 7
    assert await asyncio_fixes.wait_for(asyncio.sleep(0, result=8), None) == 8
    with pytest.raises(TimeoutError):
        await asyncio_fixes.wait_for(asyncio.Event().wait(), 0.01)
    with pytest.raises(TimeoutError):
        await asyncio_fixes.wait_for(asyncio.Event().wait(), 0)
    done = asyncio.get_running_loop().create_future()
    done.set_result(9)
    assert await asyncio_fixes.wait_for(done, 0) == 9


async def test_cancel_and_wait_waits_for_the_end_and_passes_the_callers_cancel_on():
    release = asyncio.Event()
    cleaned_up: list[bool] = []

    async def slow_to_end() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await release.wait()  # clean-up that takes a while
            cleaned_up.append(True)

    victim = asyncio.ensure_future(slow_to_end())
    await asyncio.sleep(0)
    stopper = asyncio.ensure_future(asyncio_fixes.cancel_and_wait(victim))
    for _ in range(3):
        await asyncio.sleep(0)
    assert not stopper.done()  # it waits for the clean-up
    stopper.cancel()  # the caller is cancelled meanwhile: that cancel is not swallowed
    await asyncio.wait({stopper})
    assert stopper.cancelled()
    release.set()
    await asyncio.wait({victim})
    assert victim.cancelled()
    assert cleaned_up == [True]

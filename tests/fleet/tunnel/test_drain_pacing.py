"""A draining process moves its tunnels at the pace the other replicas admit them (`fleet.tunnel.drain`): at
most `moves_in_flight()` agents are moving at once, the next ones are told as those land (superseded or
closed), and every tunnel is told in the end. Telling all at once had the new replicas refuse most of the
knocks with a Backoff, again and again, while the drain's deadline ran out."""

from __future__ import annotations

import asyncio
import time

import pytest

from fleet.tunnel import drain


class FakeTunnel:
    """A tunnel of this process as the drain sees it: told to move, then moved (its successor welcomed)."""

    def __init__(self) -> None:
        self.told = False
        self.moved = False
        self.closed_with: int | None = None

    async def drain_move(self, within_s: float) -> None:
        self.told = True

    async def close(self, code: int | None = None, reason: str | None = None) -> None:
        self.closed_with = code
        drain.closed(self)


@pytest.fixture
def tunnels():
    made = [FakeTunnel() for _ in range(25)]
    for tunnel in made:
        drain.opened(tunnel)
    yield made
    for tunnel in made:
        drain.closed(tunnel)


async def _until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@pytest.mark.asyncio
async def test_moves_are_told_a_window_at_a_time_and_the_next_as_earlier_ones_land(tunnels, settings):
    settings.AGENT_MAX_HANDSHAKES = 5
    moving = asyncio.ensure_future(drain.move_all(time.monotonic() + 60))
    try:
        await _until(lambda: sum(t.told for t in tunnels) == 5)
        await asyncio.sleep(0.3)  # several passes of the drain: nobody else is told while 5 are moving
        assert sum(t.told for t in tunnels) == 5

        landed = [t for t in tunnels if t.told][:3]
        for tunnel in landed:  # their new tunnels were welcomed (superseded: still open for their streams)
            tunnel.moved = True
        await _until(lambda: sum(t.told for t in tunnels) == 8)
        await asyncio.sleep(0.3)
        assert sum(t.told for t in tunnels) == 8

        for tunnel in [t for t in tunnels if t.told and not t.moved][:2]:  # closed: an older agent reconnected
            drain.closed(tunnel)
        await _until(lambda: sum(t.told for t in tunnels) == 10)

        while not all(t.told for t in tunnels):  # the rest land as they are told: everyone moves in the end
            for tunnel in tunnels:
                if tunnel.told:
                    tunnel.moved = True
                    drain.closed(tunnel)
            await asyncio.sleep(0.05)
        for tunnel in tunnels:
            drain.closed(tunnel)
        await asyncio.wait_for(moving, 5)  # nothing held: the drain is done
        assert all(t.closed_with is None for t in tunnels)  # nobody was cut at a deadline
    finally:
        moving.cancel()


@pytest.mark.asyncio
async def test_a_move_that_stalls_gives_its_place_to_the_next(tunnels, settings, monkeypatch):
    settings.AGENT_MAX_HANDSHAKES = 5
    monkeypatch.setattr(drain, "MOVE_STALL_S", 0.3)
    moving = asyncio.ensure_future(drain.move_all(time.monotonic() + 60))
    try:
        await _until(lambda: sum(t.told for t in tunnels) == 5)
        await _until(lambda: sum(t.told for t in tunnels) == 10, timeout=3)  # none landed: the next five anyway
    finally:
        moving.cancel()
        await asyncio.gather(moving, return_exceptions=True)


@pytest.mark.asyncio
async def test_at_the_deadline_the_tunnels_left_are_closed_going_away_and_the_log_says_what_was_needed(
    tunnels, settings, caplog
):
    settings.AGENT_MAX_HANDSHAKES = 5
    moving = asyncio.ensure_future(drain.move_all(time.monotonic() + 60))
    await _until(lambda: sum(t.told for t in tunnels) == 5)
    for tunnel in [t for t in tunnels if t.told]:
        tunnel.moved = True
        drain.closed(tunnel)
    await _until(lambda: sum(t.told for t in tunnels) == 10)
    moving.cancel()  # the deadline: 5 moved, 20 still here
    with pytest.raises(asyncio.CancelledError):
        await moving
    left = [t for t in tunnels if not t.moved]
    assert len(left) == 20
    assert all(t.closed_with == drain.CLOSE_GOING_AWAY for t in left)
    (warning,) = [r.getMessage() for r in caplog.records if "deadline reached" in r.getMessage()]
    assert "closing 20 tunnel(s) still open; 5 moved" in warning
    assert "WEB_DRAIN_DEADLINE_S" in warning

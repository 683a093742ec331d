"""The tunnels of a draining process move to another replica before it stops: make-before-break.

When this web process drains (`kernel.draining`: SIGTERM under uvicorn, `cleverthis.graceful`), `move_all`
runs after the load balancer had `WEB_DRAIN_LB_S` to take the process out:

- each tunnel of an agent that speaks protocol `MOVE_SINCE` gets a `Move` frame: the agent opens a new
  tunnel through the load balancer (another replica: this one refuses new tunnels while draining) and
  keeps this one until the new one is welcomed. The new tunnel's consumer tells every older tunnel of
  the node (`node.superseded` through the node's group); the old one leaves the node's groups (new
  commands, fan-outs and streams go to the new one) and closes with 1000 once its own streams ended;
- an older agent's tunnel closes (1012, "service restart") once its streams ended; it reconnects as
  it always did.

The moves are paced by what the other replicas admit: at most `moves_in_flight()` agents of this process
are moving at once (told, their new tunnel not yet welcomed), and the next ones are told as those land.
Each replica takes AGENT_MAX_HANDSHAKES handshakes at a time and refuses the rest with a Backoff; telling
every agent at once made each one knock about eight times (1,000 agents, 2 replicas, a busy machine),
every refused knock costing the new replicas an accept, a frame and a close while the moves waited.

At the deadline whatever is still open closes with 1001 ("going away"). `held` lists the tunnels that are
still open in this process (superseded ones included), so the drain knows when it is done.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Protocol

from django.conf import settings

from kernel import draining

log = logging.getLogger("fleet.tunnel")

# How many agents a draining process asks to move per second (their new handshakes spread over the
# others: each takes at most AGENT_MAX_HANDSHAKES at once), and the longest spread.
MOVES_PER_S = 50.0
MAX_SPREAD_S = 10.0
# A told agent whose new tunnel is not welcomed this long after (it cannot reach the load balancer, or it
# is too old to move and its streams run on) no longer holds a place among the moves in flight.
MOVE_STALL_S = 30.0
CLOSE_MOVED = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_SERVICE_RESTART = 1012


class DrainingTunnel(Protocol):
    """What the drain needs from a tunnel consumer."""

    @property
    def moved(self) -> bool: ...

    async def drain_move(self, within_s: float) -> None: ...

    async def close(self, code: int | None = None, reason: str | None = None) -> None: ...


_held: set[Any] = set()


def opened(tunnel: DrainingTunnel) -> None:
    """A tunnel of this process was welcomed."""
    _held.add(tunnel)


def closed(tunnel: DrainingTunnel) -> None:
    """A tunnel of this process closed."""
    _held.discard(tunnel)


def held() -> int:
    """How many tunnels are open in this process (superseded ones still finishing their streams included)."""
    return len(_held)


def moves_in_flight() -> int:
    """How many agents of this process may be moving at once: what one replica admits at a time."""
    return max(1, int(settings.AGENT_MAX_HANDSHAKES))


def spread_s(count: int, deadline: float) -> float:
    """Over how many seconds `count` agents start their new tunnels: at most MOVES_PER_S a second, within
    MAX_SPREAD_S and a third of the time left (the rest is for their streams to finish)."""
    left = max(0.0, deadline - time.monotonic())
    return min(count / MOVES_PER_S, MAX_SPREAD_S, left / 3)


async def move_all(deadline: float) -> None:
    """Move every tunnel of this process away, `moves_in_flight()` at a time, and wait until all closed; at
    the deadline close the rest."""
    told: dict[Any, float] = {}  # tunnel → when it was told to move
    started = time.monotonic()
    try:
        while _held:
            now = time.monotonic()
            moving = sum(
                1 for tunnel, at in told.items() if tunnel in _held and not tunnel.moved and now - at < MOVE_STALL_S
            )
            room = moves_in_flight() - moving
            fresh = [tunnel for tunnel in list(_held) if tunnel not in told][: max(0, room)]
            if fresh:
                within = spread_s(len(fresh), deadline)
                log.info(
                    "draining: moving %d tunnel(s) within %.1f s (%d moving, %d left here)",
                    len(fresh), within, moving, len(_held),
                )  # fmt: skip
                for tunnel in fresh:
                    told[tunnel] = now
                    try:
                        await tunnel.drain_move(within)
                    except Exception:  # one broken socket must not keep the others from moving
                        log.exception("draining: could not ask a tunnel to move")
            await asyncio.sleep(0.1)
    except asyncio.CancelledError:
        left = list(_held)
        if left:
            moved = sum(1 for tunnel in told if tunnel not in _held or tunnel.moved)
            rate = moved / max(1e-3, time.monotonic() - started)
            log.warning(
                "draining: deadline reached, closing %d tunnel(s) still open; %d moved at %.1f a second, so "
                "about %.0f s more were needed: raise WEB_DRAIN_DEADLINE_S and the stop grace periods with it "
                "(docs/deploy.md: Upgrades)",
                len(left), moved, rate, len(left) / rate if rate else float("inf"),
            )  # fmt: skip
        for tunnel in left:
            try:
                await tunnel.close(code=CLOSE_GOING_AWAY, reason="replica stopping")
            except Exception:
                log.exception("draining: closing a tunnel failed")
        raise


draining.on_drain(move_all)

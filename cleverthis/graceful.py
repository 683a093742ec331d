"""A web process asked to stop drains first (`kernel.draining`), then lets uvicorn shut down.

uvicorn (0.55) stops on SIGTERM by closing its listening sockets at once and closing every WebSocket with
1012: each agent's tunnel drops and reconnects, and requests a load balancer still sends there fail. So,
in each uvicorn process, `install()` (called once the ASGI app is loaded, from inside uvicorn's running
loop) puts its own SIGTERM handler before uvicorn's: the first SIGTERM starts the drain — `/healthz`
answers 503 and new tunnels are refused at once; the process keeps serving for `WEB_DRAIN_LB_S` (the load
balancer's checks see the 503 and send it nothing new), then the tunnels held here move to another
replica (`fleet.tunnel.drain`) while streams already open finish — and hands the signal to uvicorn when
the drain is done or `WEB_DRAIN_DEADLINE_S` passed. A second SIGTERM while draining changes
nothing (a preStop hook and the kubelet may both send one); SIGINT (Ctrl+C) stops at once as before.
uvicorn then waits up to its `--timeout-graceful-shutdown` (the web command sets it to the drain deadline)
for the requests still running. Under any other server (daphne in development) nothing is installed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from django.conf import settings

from kernel import draining

log = logging.getLogger("cleverthis.graceful")

_installed: dict[str, Any] = {"handler": None}


def _uvicorn_handler() -> Any:
    """uvicorn's SIGTERM handler when it is the one installed (a bound `Server.handle_exit`), else None."""
    current = signal.getsignal(signal.SIGTERM)
    owner = getattr(current, "__self__", None)
    if owner is None or type(owner).__module__ != "uvicorn.server":
        return None
    return current


def install() -> bool:
    """Drain before uvicorn stops, in this process; False when not under uvicorn's running server."""
    if _installed["handler"] is not None:
        return True
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    uvicorn_exit = _uvicorn_handler()
    if uvicorn_exit is None:
        return False

    def on_sigterm(signum: int, frame: Any) -> None:
        if draining.is_draining():
            return
        draining.begin(settings.WEB_DRAIN_DEADLINE_S)
        loop.call_soon_threadsafe(lambda: loop.create_task(_drain_then_exit(uvicorn_exit, signum, frame)))

    signal.signal(signal.SIGTERM, on_sigterm)
    _installed["handler"] = on_sigterm
    return True


async def _drain_then_exit(uvicorn_exit: Any, signum: int, frame: Any) -> None:
    log.info("draining (at most %.0f s) before stopping", settings.WEB_DRAIN_DEADLINE_S)
    try:
        await draining.drain(settings.WEB_DRAIN_DEADLINE_S, settle_s=settings.WEB_DRAIN_LB_S)
    except Exception:
        log.exception("draining failed; stopping now")
    log.info("drained; stopping")
    uvicorn_exit(signum, frame)

"""The periodic look at the revocation list for every tunnel of a process (a missed revoke broadcast)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from django.conf import settings

from fleet.tunnel import auth as tunnel_auth
from fleet.tunnel.records import database_sync_to_async

log = logging.getLogger("fleet.tunnel")


class RevocableTunnel(Protocol):
    """What the watch needs of a tunnel: its certificate's serial and a way to close it as revoked."""

    certificate_serial: str | None

    async def node_revoke(self, message: dict[str, Any]) -> None: ...


class RevocationWatch:
    """Belt and braces for a missed revoke broadcast: every AGENT_REVOCATION_RECHECK_S, one look at the
    revocation list for all the tunnels of this process (a query per 1,000 of them), instead of a query
    per tunnel (10,000 tunnels made that 333 queries a second, as many as their heartbeats).

    The loop runs as long as the process's event loop; a failed pass is logged and the next one runs.
    """

    CHUNK = 1000

    def __init__(self) -> None:
        self._tunnels: set[RevocableTunnel] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    def add(self, tunnel: RevocableTunnel) -> None:
        """Watch an authenticated tunnel (starts this event loop's pass loop on first use)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new event loop (tests): tunnels of the old one are gone
            self._loop, self._tunnels, self._task = loop, set(), None
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run())
        self._tunnels.add(tunnel)

    def discard(self, tunnel: RevocableTunnel) -> None:
        self._tunnels.discard(tunnel)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(settings.AGENT_REVOCATION_RECHECK_S)
            try:
                await self.check_now()
            except Exception:  # the database away: the next pass tries again
                log.exception("revocation re-check failed; next one in %ss", settings.AGENT_REVOCATION_RECHECK_S)

    async def check_now(self) -> int:
        """One pass: close every watched tunnel whose certificate is revoked; returns how many."""
        tunnels = [t for t in self._tunnels if t.certificate_serial]
        closed = 0
        for first in range(0, len(tunnels), self.CHUNK):
            chunk = tunnels[first : first + self.CHUNK]
            serials = [t.certificate_serial or "" for t in chunk]
            revoked = await database_sync_to_async(tunnel_auth.revoked_among)(serials)
            for tunnel in chunk:
                if tunnel.certificate_serial in revoked:
                    self._tunnels.discard(tunnel)
                    await tunnel.node_revoke({"reason": "certificate revoked"})
                    closed += 1
        return closed


REVOCATIONS = RevocationWatch()

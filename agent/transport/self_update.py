"""The agent updating itself (`agent.update`): install beside the running version, switch once running
commands are done, restart into it; a version on trial rolls back unless it connects in time.

`SelfUpdate` is the part of `agent.transport.tunnel.TunnelClient` that does it; the session (the
tunnel) confirms the trial once it is welcomed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from agent import inventory
from agent import protocol as p
from agent.config import AgentConfig
from agent.errors import CommandFailed
from agent.update import launch, updater

if TYPE_CHECKING:
    from agent.transport.commands import RunnerLike
    from agent.transport.sender import FrameSender

log = logging.getLogger("agent.tunnel")

EXIT_RESTART = launch.EXIT_RESTART  # switched versions: start again (systemd restarts it, else re-exec)


class SelfUpdate:
    """`agent.update` and the update's trial, for the tunnel client (which holds the state used here)."""

    config: AgentConfig
    exit_code: int
    _stop: asyncio.Event | None
    _trial: Any
    _updating: bool
    _running_keys: set[str]
    _sender: FrameSender | None

    def _restart(self) -> None:
        """End `run` with EXIT_RESTART: the process restarts into the version `current` names."""
        self.exit_code = EXIT_RESTART
        if self._stop is not None:
            self._stop.set()

    async def _trial_deadline(self, marker: Any) -> None:
        """This version is on trial: unless it connects by the marker's deadline, roll back and restart."""
        await asyncio.sleep(max(0.0, marker.deadline - time.time()))
        if self._trial is marker:
            await asyncio.to_thread(updater.rollback, self.config, marker, "did not connect in time")
            self._restart()

    async def _update(self, command: p.Command, runner: RunnerLike) -> None:
        """agent.update: install the version beside this one, switch over once running commands are done,
        and restart. Failures before the switch are this command's error; after it the new version (or
        the rollback) journals the outcome, which answers the command when the control plane re-sends it."""
        outcome: p.Result | p.Error | None = None
        try:
            payload = p.parse_payload(command.command_type, command.payload)
            if payload.version == inventory.agent_version():
                result = p.AgentUpdateResult(version=payload.version, unchanged=True)
                outcome = p.Result(command_id=command.command_id, data=p.result_to_dict(result))
            else:
                self._send(p.Progress(command_id=command.command_id, message=f"downloading agent {payload.version}"))
                self._updating = True
                await asyncio.to_thread(updater.prepare, self.config, command, payload)
        except p.ProtocolError as exc:
            outcome = p.Error(command_id=command.command_id, code="invalid_payload", message=str(exc))
        except CommandFailed as exc:
            outcome = p.Error(command_id=command.command_id, code=exc.code, message=exc.message)
        if outcome is not None:
            self._updating = False
            if isinstance(outcome, p.Error):
                log.error("agent update failed, staying on %s: %s", inventory.agent_version(), outcome.message)
            await asyncio.to_thread(runner.record, command.idempotency_key, command.command_type, outcome)
            self._send(outcome)
            return
        while self._running_keys - {command.idempotency_key}:  # never cut a command short
            await asyncio.sleep(0.2)
        message = f"agent {payload.version} installed; restarting into it"
        self._send(p.Progress(command_id=command.command_id, message=message))
        if self._sender is not None:
            await self._sender.flush(5.0)
        log.info("%s", message)
        self._restart()

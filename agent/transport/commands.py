"""The agent's handling of commands: each idempotency key runs once, answered with ack, progress and a
result or error; the inventory is reported when a command changed it.

`CommandHandling` is the part of `agent.transport.tunnel.TunnelClient` that does it; the runner
(`agent.runner.CommandRunner`, `RunnerLike` here) executes, and journals what finished.

Commands execute on a thread pool of their own (`COMMAND_THREADS`), never on the event loop's default one:
that one holds only cpu_count + 4 threads (6 on a 2-core node), and the agent's short blocking calls run there
(the journal look-up before each acknowledgment, the heartbeat's inventory, the health probes). A few long
commands (endpoint starts waiting for readiness, model downloads, `ray.status` inside a busy container) filled
it, and every later command then went unacknowledged until one of them ended, as if it had never arrived.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from agent import protocol as p

if TYPE_CHECKING:
    from agent.transport.sender import FrameSender

log = logging.getLogger("agent.tunnel")

# The most commands that execute at once (more wait for a thread, acknowledged already); threads start on use.
COMMAND_THREADS = 64
_COMMANDS = ThreadPoolExecutor(max_workers=COMMAND_THREADS, thread_name_prefix="agent-command")


class RunnerLike(Protocol):
    """What the tunnel needs from `agent.runner.CommandRunner`."""

    def run(self, command: p.Command, progress: Callable[..., None]) -> p.Result | p.Error: ...

    def completed(self, idempotency_key: str) -> p.Result | p.Error | None: ...

    def inventory(self, gpus: list[p.GpuInfo]) -> p.Inventory: ...

    def proxy_ports(self) -> set[int]: ...

    def record(self, idempotency_key: str, command_type: str, outcome: p.Result | p.Error) -> None: ...

    def end_workloads(self) -> None: ...


class CommandHandling:
    """Commands of the tunnel client (which holds the state used here and the session that sends)."""

    runner: RunnerLike | None
    _running_keys: set[str]
    _sender: FrameSender | None
    _tasks: set[asyncio.Task[Any]]
    _gpus: list[p.GpuInfo]
    _reported_inventory: p.Inventory | None

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send(self, frame: p.Frame) -> None:
        """Send on the current session, if any (results of a lost session stay in the runner's journal)."""
        if self._sender is not None:
            self._sender.send(frame)

    async def _on_command(self, command: p.Command) -> None:
        """Run `command`; a failure of the agent's own handling is answered with an `internal` Error."""
        try:
            await self._handle_command(command)
        except Exception as exc:
            log.error("handling command %s (%s) failed", command.command_id, command.command_type, exc_info=exc)
            message = f"the agent failed handling the command: {type(exc).__name__}: {exc}"
            self._send(p.Error(command_id=command.command_id, code="internal", message=message[:2000]))

    async def _handle_command(self, command: p.Command) -> None:
        log.info("command received: %s", command.command_type)
        assert self.runner is not None
        runner = self.runner
        key = command.idempotency_key
        # Checked and taken before the first await: a second delivery of the key (the control plane's
        # resend after a reconnect racing the dispatch of the same command) finds it taken, whatever
        # this one is waiting for.
        if key in self._running_keys:
            self._send(p.Ack(command_id=command.command_id, duplicate=True))
            return
        self._running_keys.add(key)
        try:
            await self._run_once(command, runner)
        finally:
            self._running_keys.discard(key)

    async def _run_once(self, command: p.Command, runner: RunnerLike) -> None:
        """Run `command`, whose key this delivery holds: answered from the journal when it finished before."""
        previous = await asyncio.to_thread(runner.completed, command.idempotency_key)
        if previous is not None:
            self._send(p.Ack(command_id=command.command_id, duplicate=True))
            self._send(replace(previous, command_id=command.command_id, id=p.new_id()))
            return
        self._send(p.Ack(command_id=command.command_id))
        if command.command_type == "agent.update":
            await self._update(command, runner)
            return
        loop = asyncio.get_running_loop()

        def progress(message: str, percent: float | None = None, data: dict[str, Any] | None = None) -> None:
            frame = p.Progress(command_id=command.command_id, message=message, percent=percent, data=data or {})
            loop.call_soon_threadsafe(self._send, frame)

        started = time.monotonic()
        outcome = await loop.run_in_executor(_COMMANDS, runner.run, command, progress)
        log.info(
            "command %s %s in %.2fs",
            command.command_type,
            "succeeded" if isinstance(outcome, p.Result) else "failed",
            time.monotonic() - started,
        )
        self._send(outcome)
        await self._report_inventory()

    async def _report_inventory(self) -> None:
        """Send the inventory if it changed since the last one this session reported (Hello included).

        A command that changed nothing on the node (or a fan-out to a thousand of them) then costs the
        control plane no reconcile; a reconnect always starts with the full inventory in the Hello.
        An unexpected failure ends the session: the reconnect's Hello carries a fresh inventory.
        """
        try:
            inv = await self._inventory(self._gpus)
            await self._refresh_proxy_ports()
        except Exception as exc:
            self._fail_session("inventory report", exc)
            return
        if inv != self._reported_inventory:
            self._reported_inventory = inv
            self._send(p.InventoryReport(inventory=inv))

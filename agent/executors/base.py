"""The interface every executor implements (documented failures raise `agent.errors.CommandFailed`).

Executors are synchronous (the docker, kubernetes and git libraries all block); the tunnel runs them in
a worker thread and hands them a thread-safe `ProgressFn`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from agent.protocol import ContainerInfo, ContainerResult

# progress(message, percent=None, data=None) — safe to call from any thread.
ProgressFn = Callable[..., None]


class Executor(Protocol):
    """Runs container commands for one orchestration mode."""

    mode: str

    def execute(self, command_type: str, payload: Any, *, command_key: str, progress: ProgressFn) -> ContainerResult:
        """Run one `container.*` command (payload already parsed by `agent.protocol.parse_payload`).

        Returns its typed result (`agent.protocol.ContainerResult`, with at least ``container_id``). Must be
        idempotent on `command_key`: running the same create twice returns the first container.
        Raises `CommandFailed` for documented failures.
        """
        ...

    def list_containers(self) -> list[ContainerInfo]:
        """Every workload this executor manages on the node (for the inventory sent on reconnect)."""
        ...

"""Where an endpoint's server runs: the one interface the endpoint manager starts, lists, probes and stops a
server through, whether it is a process of this node (`agent.workloads.server_process.ProcessHost`) or a
rank inside a Ray node's container (`agent.workloads.container_rank.ContainerHost`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Protocol

from agent.workloads.engine import Engine


class Spawned(Protocol):
    """What the endpoint manager watches of a started server: a child process or a `ContainerProcess`."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...


@dataclasses.dataclass(frozen=True)
class Launch:
    """A server to start: its command line and environment, its output's file, what its command line names
    (`token`, by which `ServerHost.alive` knows it), the model snapshot it reads, and, on a CPU node, the cores
    it is bound to; a `follower` rank serves no HTTP."""

    argv: list[str]
    env: dict[str, str]
    token: str
    model_path: Path
    log_path: Path
    follower: bool = False
    cores: list[int] = dataclasses.field(default_factory=list)


class ServerHost(Protocol):
    """Starts, probes and ends servers in one place; a record's `fields()` find the same host again."""

    local: bool  # whether a server's pid is a pid of this node (a marked process with it is no stray)

    def prepare(self, engine: Engine, model_path: Path) -> tuple[Engine, Path]:
        """The engine and model path as the server sees them here; CommandFailed when it cannot run here."""
        ...

    def start(self, launch: Launch) -> Spawned:
        """Start the server `launch` describes."""
        ...

    def fields(self) -> dict[str, Any]:
        """What a server's record keeps to find this host again."""
        ...

    def alive(self, record: dict[str, Any]) -> bool:
        """Whether the record's server still runs."""
        ...

    def stop(self, pid: int, *, timeout_s: float) -> None:
        """End server `pid` and whatever it started (SIGTERM, SIGKILL after `timeout_s`)."""
        ...

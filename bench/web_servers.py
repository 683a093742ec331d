"""The ASGI servers the benchmarks compare, and the CPU each group of processes spends.

One application (`cleverthis.asgi:application`) is served by each candidate in turn; `start` runs one
replica (`workers` processes sharing its port) as the tests and the Procfile run it
(`tests.support.processes.web_server`). `CpuMeter`
reads user + system CPU seconds per role (a replica's whole process tree, the agents processes, Redis,
PostgreSQL's backends of one database), so each benchmark can print what every process spent.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

from tests.support.processes import ManagedProcess, web_server

SERVERS = ("daphne", "uvicorn", "granian")


def installed(names: Iterable[str] = SERVERS) -> list[str]:
    """The servers among `names` that this virtualenv can run."""
    return [name for name in names if importlib.util.find_spec(name) is not None]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every server-comparing benchmark takes: `--servers` and `--workers`."""
    parser.add_argument(
        "--servers",
        nargs="+",
        choices=SERVERS,
        default=installed(),
        help="ASGI servers to compare (default: every one installed)",
    )
    parser.add_argument("--workers", type=int, default=1, help="web processes per replica")


def start(log_dir: Path, port: int, *, server: str, workers: int, env: dict[str, str], name: str) -> ManagedProcess:
    """One replica of the web process under `server`: `workers` processes on 127.0.0.1:`port` (daphne,
    which has no workers, always runs one: `processes_per_replica` says so)."""
    return web_server(log_dir, port, server=server, workers=processes_per_replica(server, workers), env=env, name=name)


def processes_per_replica(server: str, workers: int) -> int:
    """How many web processes a replica of `server` runs when `workers` are asked for."""
    return 1 if server == "daphne" else workers


def tree(pid: int) -> list[psutil.Process]:
    """The process `pid` and every descendant alive now (a server's master and its workers)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def database_backends(database: str) -> list[psutil.Process]:
    """PostgreSQL backends serving `database` now (their process title names it; the server is shared)."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        title = " ".join(proc.info["cmdline"] or [])
        if proc.info["name"] == "postgres" and f" {database} " in f" {title} ":
            found.append(proc)
    return found


def cpu_seconds(procs: Iterable[psutil.Process]) -> float:
    """User + system CPU seconds the processes used so far (those gone since are skipped)."""
    total = 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


class CpuMeter:
    """CPU seconds per role between `start()` and `read()`.

    Each role is a callable listing its processes; it is called at both ends and a process is counted
    over the time it was seen at both (one that came or went in between contributes what it can: an
    approximation for short-lived PostgreSQL backends only, the other roles keep their processes).
    """

    def __init__(self, roles: dict[str, Callable[[], list[psutil.Process]]]) -> None:
        self.roles = roles
        self._before: dict[str, dict[int, float]] = {}
        self._procs: dict[str, list[psutil.Process]] = {}

    def start(self) -> None:
        self._procs = {role: list(listing()) for role, listing in self.roles.items()}
        self._before = {role: self._per_pid(procs) for role, procs in self._procs.items()}

    @staticmethod
    def _per_pid(procs: Iterable[psutil.Process]) -> dict[int, float]:
        return {proc.pid: cpu_seconds([proc]) for proc in procs}

    def read(self) -> dict[str, float]:
        """CPU seconds each role spent since `start()`."""
        spent = {}
        for role, listing in self.roles.items():
            procs = {proc.pid: proc for proc in [*self._procs.get(role, []), *listing()]}
            after = self._per_pid(procs.values())
            before = self._before.get(role, {})
            spent[role] = sum(max(0.0, value - before.get(pid, 0.0)) for pid, value in after.items())
        return spent

    def counts(self) -> dict[str, int]:
        """How many processes each role had at `start()`."""
        return {role: len(procs) for role, procs in self._procs.items()}

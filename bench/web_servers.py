"""The ASGI servers the benchmarks compare, and the CPU each group of processes spends.

One application (`cleverthis.asgi:application`) is served by each candidate in turn; `start` runs one
replica (`workers` processes sharing its port) through `tests.support.processes.web_server`. `CpuMeter`
reads user + system CPU seconds per role (a replica's whole process tree, the agents processes, Redis,
PostgreSQL's backends of one database), so each benchmark can print what every process spent.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

from tests.support.processes import ManagedProcess

SERVERS = ("daphne", "uvicorn", "granian")


def installed(names: Iterable[str] = SERVERS) -> list[str]:
    """The servers among `names` that this virtualenv can run."""
    return [name for name in names if importlib.util.find_spec(name) is not None]


def start(log_dir: Path, port: int, *, server: str, workers: int, env: dict[str, str], name: str) -> ManagedProcess:
    """One replica of the web process under `server`: `workers` processes on 127.0.0.1:`port`."""
    try:
        from tests.support.processes import web_server
    except ImportError:  # INTERIM until the `server` branch lands
        web_server = _interim_web_server
    return web_server(log_dir, port, server=server, workers=workers, env=env, name=name)


def _interim_web_server(log_dir, port, *, server=None, workers=1, env=None, name="web", host="127.0.0.1"):  # type: ignore[no-untyped-def]
    """INTERIM: uvicorn/granian argv until tests.support.processes.web_server exists."""
    from tests.support.processes import VENV_BIN, daphne

    app = "cleverthis.asgi:application"
    if server in (None, "daphne"):
        assert workers == 1
        return daphne(log_dir, port, env=env, name=name, host=host)
    if server == "uvicorn":
        argv = [str(VENV_BIN / "uvicorn"), "--host", host, "--port", str(port), "--workers", str(workers)]
        argv += ["--loop", "uvloop", "--http", "httptools", "--ws", "websockets", "--lifespan", "off"]
        argv += ["--no-access-log", "--backlog", "1024", "--ws-max-size", str(4 << 20), "--log-level", "warning"]
        argv += ["--ws-ping-interval", "10", "--ws-ping-timeout", "20", app]
    else:
        argv = [str(VENV_BIN / "granian"), "--interface", "asginl", "--host", host, "--port", str(port)]
        argv += ["--workers", str(workers), "--loop", "uvloop", "--backlog", "1024", "--log-level", "warning", app]
    return ManagedProcess(name, argv, log_dir=log_dir, env=env)


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

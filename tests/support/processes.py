"""Start and stop the real processes integration tests need (web servers, celery workers, agents)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(os.path.abspath(sys.executable)).parent


# Set in this process by the settings for its own metrics: a control-plane child finds the same directory
# through its settings, and anything else (agents, the Ray processes they start) must not write there.
# CLEVERTHIS_DB_NAME names this session's database only: a child is given its DATABASE_URL (the test
# database), which the settings refuse when a CLEVERTHIS_DB_NAME beside it names another.
PROCESS_LOCAL_ENV = ("PROMETHEUS_MULTIPROC_DIR", "CLEVERTHIS_DB_NAME")


def clean_environ() -> dict[str, str]:
    """This process's environment for a child, without what belongs to this process alone."""
    return {k: v for k, v in os.environ.items() if k not in PROCESS_LOCAL_ENV}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(
    predicate: Callable[[], bool], *, timeout: float, interval: float = 0.1, what: str = "condition"
) -> None:
    """Poll `predicate` until it is true; raise TimeoutError naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts TCP connections on host:port."""
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


class ManagedProcess:
    """A child process with its output captured to a log file; stopped (and reaped) on `stop()`."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_dir: Path,
        env: dict[str, str] | None = None,
        cwd: Path = REPO_ROOT,
    ) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        full_env = {**clean_environ(), "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {})}
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        self.popen = subprocess.Popen(
            list(argv), cwd=cwd, env=full_env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def log(self) -> str:
        """Everything the process printed so far."""
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to the whole process group (no clean shutdown for SIGKILL)."""
        if self.alive():
            os.killpg(self.popen.pid, sig)

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM, then SIGKILL if it does not exit within `timeout` seconds."""
        if self.alive():
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=timeout)
        self._log.close()


def celery_worker(
    log_dir: Path,
    *,
    queues: str = "default,dispatch",
    env: dict[str, str] | None = None,
    name: str = "celery-worker",
) -> ManagedProcess:
    """A real Celery worker for the project app, solo pool, consuming `queues`."""
    argv = [
        str(VENV_BIN / "celery"),
        "-A",
        "cleverthis",
        "worker",
        "-Q",
        queues,
        "--pool=solo",
        "--loglevel=INFO",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-n",
        f"{name}@%h",
    ]
    return ManagedProcess(name, argv, log_dir=log_dir, env=env)


# As in the Procfile: the server lets tunnel frames somewhat over the protocol's 1 MiB limit through, so the
# consumer (not the server) refuses them, closing that socket with 4400 and a reason; a message over this
# gets the server's own 1009 close.
MAX_WEBSOCKET_MESSAGE_BYTES = 4 * 1024 * 1024
DAPHNE_MAX_MESSAGE_BYTES = MAX_WEBSOCKET_MESSAGE_BYTES
# As in the Procfile: WebSocket keepalive pings after this many idle seconds, and a socket whose peer
# answers none within the timeout is dropped (a frozen agent's half-open tunnel). `env` may set both.
TUNNEL_PING_INTERVAL_S = 10
TUNNEL_PING_TIMEOUT_S = 20
# As in the Procfile: many clients (a reconnecting fleet) connect at once.
LISTEN_BACKLOG = 2048

# The control plane's production ASGI server (the Procfile's web command); `CONTROL_PLANE_SERVER` in the
# tests' environment runs them on another. daphne serves `manage.py runserver`; granian is benchmarked.
PRODUCTION_SERVER = "uvicorn"
SERVERS = ("uvicorn", "daphne", "granian")
# What a few key tunnel tests run on, each: production's server and development's (both must keep passing).
BOTH_SERVERS = ("uvicorn", "daphne")
ASGI_APP = "cleverthis.asgi:application"


def default_server() -> str:
    """The server `web_server` starts when none is named: `CONTROL_PLANE_SERVER`, else the production one."""
    server = os.environ.get("CONTROL_PLANE_SERVER") or PRODUCTION_SERVER
    if server not in SERVERS:
        raise ValueError(f"CONTROL_PLANE_SERVER={server!r}: expected one of {', '.join(SERVERS)}")
    return server


def web_server_argv(
    server: str, port: int, *, workers: int = 1, host: str = "127.0.0.1", env: dict[str, str] | None = None
) -> list[str]:
    """The command line of `server` serving the project's ASGI app as the Procfile runs it.

    The same semantics on each: messages up to `MAX_WEBSOCKET_MESSAGE_BYTES` (over it: close 1009),
    keepalive pings every TUNNEL_PING_INTERVAL_S with TUNNEL_PING_TIMEOUT_S to answer (read from `env`),
    a deep listen backlog, no access log, no proxy headers trusted. granian has no options for the
    message limit or pings (its defaults apply: larger messages, no pings): it is here for benchmarks.
    """
    settings = env or {}
    ping_interval = settings.get("TUNNEL_PING_INTERVAL_S", str(TUNNEL_PING_INTERVAL_S))
    ping_timeout = settings.get("TUNNEL_PING_TIMEOUT_S", str(TUNNEL_PING_TIMEOUT_S))
    if server == "uvicorn":
        return [
            str(VENV_BIN / "uvicorn"),
            ASGI_APP,
            f"--host={host}",
            f"--port={port}",
            f"--workers={workers}",
            f"--backlog={LISTEN_BACKLOG}",
            *UVICORN_OPTIONS,
            f"--ws-max-size={MAX_WEBSOCKET_MESSAGE_BYTES}",
            f"--ws-ping-interval={ping_interval}",
            f"--ws-ping-timeout={ping_timeout}",
        ]
    if server == "daphne":
        if workers != 1:
            raise ValueError("daphne serves from one process: run several daphnes on ports of their own")
        return [
            str(VENV_BIN / "daphne"),
            "-e",
            f"tcp:port={port}:interface={host}:backlog={LISTEN_BACKLOG}",
            f"--websocket-max-message-size={MAX_WEBSOCKET_MESSAGE_BYTES}",
            f"--websocket-max-frame-size={MAX_WEBSOCKET_MESSAGE_BYTES}",
            f"--ping-interval={ping_interval}",
            f"--ping-timeout={ping_timeout}",
            ASGI_APP,
        ]
    if server == "granian":
        return [
            str(VENV_BIN / "granian"),
            "--interface=asginl",  # no lifespan: the app (Channels' router) has none
            f"--host={host}",
            f"--port={port}",
            f"--workers={workers}",
            f"--backlog={LISTEN_BACKLOG}",
            "--loop=uvloop",
            "--log-level=warning",
            ASGI_APP,
        ]
    raise ValueError(f"unknown ASGI server {server!r}: expected one of {', '.join(SERVERS)}")


# uvicorn as in the Procfile: uvloop, httptools, the sans-I/O websockets protocol with a closing handshake
# for a failed connection (`cleverthis.uvicorn_fixes`: 1009 reaches the peer); no compression of tunnel
# frames (daphne offers none either), no lifespan (Channels' router has none), no Server/Date headers added
# to proxied responses (as daphne: the node's own pass through), a bounded wait for open streams at shutdown.
UVICORN_OPTIONS = (
    "--loop=uvloop",
    "--http=httptools",
    "--ws=cleverthis.uvicorn_fixes:ClosingHandshakeProtocol",
    "--ws-per-message-deflate=false",
    "--lifespan=off",
    "--no-access-log",
    "--no-server-header",
    "--no-date-header",
    "--no-proxy-headers",
    "--timeout-graceful-shutdown=5",
)


def web_server(
    log_dir: Path,
    port: int,
    *,
    server: str | None = None,
    workers: int = 1,
    env: dict[str, str] | None = None,
    name: str = "web",
    host: str = "127.0.0.1",
) -> ManagedProcess:
    """The project's ASGI app served on `host`:`port` by `server` (`default_server()` when None) with
    `workers` processes sharing the listening socket (uvicorn, granian; daphne has one)."""
    argv = web_server_argv(server or default_server(), port, workers=workers, host=host, env=env)
    return ManagedProcess(name, argv, log_dir=log_dir, env=env)


def daphne(
    log_dir: Path, port: int, *, env: dict[str, str] | None = None, name: str = "daphne", host: str = "127.0.0.1"
) -> ManagedProcess:
    """A real daphne serving the project's ASGI app on `host`:`port` (`web_server` with daphne)."""
    return web_server(log_dir, port, server="daphne", env=env, name=name, host=host)

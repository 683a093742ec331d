"""Start and stop the real processes integration tests need (daphne, celery workers, agents)."""

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
PROCESS_LOCAL_ENV = ("PROMETHEUS_MULTIPROC_DIR",)


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


# As in the Procfile: daphne lets tunnel frames somewhat over the protocol's 1 MiB limit through, so the
# consumer (not the server) refuses them, closing that socket with 4400 and a reason.
DAPHNE_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# As in the Procfile: WebSocket keepalive pings after this many idle seconds, and a socket whose peer
# answers none within the timeout is dropped (a frozen agent's half-open tunnel). `env` may set both.
TUNNEL_PING_INTERVAL_S = 10
TUNNEL_PING_TIMEOUT_S = 20


def daphne(
    log_dir: Path, port: int, *, env: dict[str, str] | None = None, name: str = "daphne", host: str = "127.0.0.1"
) -> ManagedProcess:
    """A real daphne serving the project's ASGI app on `host`:`port` (the Procfile's BIND_ADDRESS)."""
    settings = env or {}
    argv = [
        str(VENV_BIN / "daphne"),
        "-e",
        f"tcp:port={port}:interface={host}:backlog=1024",  # as the Procfile: many clients connect at once
        f"--websocket-max-message-size={DAPHNE_MAX_MESSAGE_BYTES}",
        f"--websocket-max-frame-size={DAPHNE_MAX_MESSAGE_BYTES}",
        f"--ping-interval={settings.get('TUNNEL_PING_INTERVAL_S', TUNNEL_PING_INTERVAL_S)}",
        f"--ping-timeout={settings.get('TUNNEL_PING_TIMEOUT_S', TUNNEL_PING_TIMEOUT_S)}",
        "cleverthis.asgi:application",
    ]
    return ManagedProcess(name, argv, log_dir=log_dir, env=env)

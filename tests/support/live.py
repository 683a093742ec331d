"""A live control plane for end-to-end tests: real web replicas (the production ASGI server unless
`CONTROL_PLANE_SERVER` or the test names another), a real Celery worker, real agents.

The subprocesses use the test database that pytest-django created (tests using these helpers need
`transactional_db` so rows are committed and visible across processes) and the test Redis database.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from agent.workloads.endpoints import EndpointManager
from agent.workloads.models import ModelCache
from tests.support.processes import (
    REPO_ROOT,
    ManagedProcess,
    celery_worker,
    clean_environ,
    free_port,
    port_open,
    wait_until,
    web_server,
)


def subprocess_env(**overrides: str) -> dict[str, str]:
    """Environment for control-plane subprocesses pointing at the test database and test Redis."""
    db = settings.DATABASES["default"]
    env = {
        "DJANGO_SETTINGS_MODULE": "cleverthis.settings.test",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "TEST_REDIS_URL": settings.REDIS_URL,
        "AGENT_HEARTBEAT_INTERVAL_S": "1",
        "AGENT_REVOCATION_RECHECK_S": "5",
        "AGENT_HELLO_TIMEOUT_S": "10",
        "PROXY_MAX_BODY_BYTES": str(8 * 1024 * 1024),
        "USAGE_FLUSH_S": "0.5",  # usage rollups written within half a second of a request
    }
    env.update(overrides)
    return env


@dataclass
class ControlPlane:
    """One or more web replicas plus a Celery worker, all on the test database; the replicas listen on
    `host` (loopback by default; an address agents in other network namespaces reach, for simulated hosts)
    and run `server` (`processes.default_server()` when None) with `workers` processes each."""

    log_dir: Path
    env: dict[str, str]
    host: str = "127.0.0.1"
    replicas: list[ManagedProcess] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    worker: ManagedProcess | None = None
    server: str | None = None
    workers: int = 1

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.ports[0]}"

    def start_replica(self, port: int | None = None) -> int:
        """Start a web replica on `port` (a free one by default) and wait until it listens."""
        port = port or free_port()
        index = len(self.replicas)
        proc = web_server(
            self.log_dir,
            port,
            server=self.server,
            workers=self.workers,
            env=self.env,
            name=f"web-{index}-{port}",
            host=self.host,
        )
        wait_until(lambda: port_open(port, self.host) or not proc.alive(), timeout=30, what=f"web server on {port}")
        assert proc.alive(), proc.log()
        self.replicas.append(proc)
        self.ports.append(port)
        return port

    def start_worker(self) -> None:
        self.worker = celery_worker(self.log_dir, env=self.env)

    def stop(self) -> None:
        for proc in [*self.replicas, *([self.worker] if self.worker else [])]:
            proc.stop()

    def logs(self) -> str:
        return "\n".join(f"==== {p.name}\n{p.log()[-4000:]}" for p in [*self.replicas, *filter(None, [self.worker])])


def agent_join(url: str, token: str, state_dir: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `python -m agent join` as a separate process."""
    return subprocess.run(
        [sys.executable, "-m", "agent", "join", "--url", url, "--token", token, "--state-dir", str(state_dir)],
        cwd=REPO_ROOT,
        env={**clean_environ(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def agent_run(
    state_dir: Path, log_dir: Path, *, name: str = "agent", env: dict[str, str] | None = None
) -> ManagedProcess:
    """Start `python -m agent run` as a separate process."""
    argv = [sys.executable, "-m", "agent", "run", "--state-dir", str(state_dir)]
    return ManagedProcess(name, argv, log_dir=log_dir, env=env)


def stop_endpoint_servers(state_dir: Path) -> None:
    """Stop the inference endpoint servers the agent with this state started.

    They run in sessions of their own and outlive the agent on purpose (an agent restart keeps serving),
    so stopping the agent leaves them running: a test stops them as the node's operator would.
    """
    endpoints = state_dir / "work" / "endpoints"
    if endpoints.is_dir():
        EndpointManager(ModelCache(state_dir / "models"), endpoints).stop_all()

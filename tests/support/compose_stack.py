"""The deploy/compose stack run by podman-compose for a test: build its images, bring it up behind TLS
from a local CA, act inside it (manage.py, commands to a node), and take it down leaving nothing behind.

Clients reach its wildcard node-origin hosts (`endpoint-….endpoints.localhost`) with curl's own resolver
override (`--resolve`), verifying the local CA: no /etc/hosts edits.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from tests.support.environment import missing
from tests.support.podman_env import podman_env
from tests.support.processes import REPO_ROOT, VENV_BIN, free_port, wait_until

COMPOSE_DIR = REPO_ROOT / "deploy" / "compose"


@dataclass
class Stack:
    """A running compose project: its URL, the local CA that signed its certificate, its containers."""

    project: str
    env_file: Path
    url: str
    ca: Path
    env: dict[str, str]

    @property
    def port(self) -> int:
        return int(urlsplit(self.url).port or 443)

    def container(self, service: str, number: int = 1) -> str:
        return f"{self.project}_{service}_{number}"

    def podman(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def manage(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """A manage.py command in the first web container."""
        return self.podman("exec", self.container("web"), "cleverthis", "manage", *args, timeout=timeout)

    def shell(self, code: str, timeout: float = 120) -> str:
        """The last line `code` prints, run by Django's shell inside the stack."""
        done = self.manage("shell", "-c", code, timeout=timeout)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.strip().splitlines()[-1]  # after Django's shell's "N objects imported" line

    def setting(self, name: str) -> str:
        """A setting of the stack's settings file."""
        return next(
            line.split("=", 1)[1] for line in self.env_file.read_text().splitlines() if line.startswith(f"{name}=")
        )

    def change_setting(self, name: str, value: str) -> None:
        """Change a setting in the stack's settings file (as an operator edits deploy/compose/.env)."""
        lines = [
            f"{name}={value}" if line.startswith(f"{name}=") else line
            for line in self.env_file.read_text().splitlines()
        ]
        self.env_file.write_text("\n".join(lines) + "\n")

    def compose(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        argv = [str(VENV_BIN / "podman-compose"), "-p", self.project, "-f", str(COMPOSE_DIR / "compose.yaml")]
        argv += ["--env-file", str(self.env_file), *args]
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)

    def names(self, service: str | None = None) -> list[str]:
        """The names of the project's containers (of one service), sorted."""
        filters = ["--filter", f"label=io.podman.compose.project={self.project}"]
        if service:
            filters += ["--filter", f"label=com.docker.compose.service={service}"]
        return sorted(self.podman("ps", "-a", *filters, "--format", "{{.Names}}").stdout.split())

    def pid(self, container: str) -> int:
        """The host pid of the container's main process (0 while it is not running)."""
        return int(self.podman("inspect", "--format", "{{.State.Pid}}", container).stdout.strip() or 0)

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{self.podman('logs', '--tail', '30', n).stderr[-3000:]}" for n in self.names())

    def curl(self, url: str, *args: str) -> list[str]:
        """A curl command line for `url` on this stack: the host resolved to 127.0.0.1, the local CA verified."""
        host = urlsplit(url).hostname
        pin = f"{host}:{self.port}:127.0.0.1"
        return [
            "curl",
            "--silent",
            "--show-error",
            "--no-buffer",
            "--cacert",
            str(self.ca),
            "--resolve",
            pin,
            *args,
            url,
        ]


def build_images() -> dict[str, str]:
    """deploy/build-image's images (cached by content hash); skips where the stack cannot run."""
    if os.geteuid() != 0:
        missing("the deployment stack needs root (rootful Podman)", "run the tests as root, as CI does")
    if shutil.which("podman") is None:
        missing("Podman is not installed", ".ci/podman-setup installs it")
    if not (VENV_BIN / "podman-compose").exists():
        missing("podman-compose is not installed", "pip install -r requirements/dev.txt")
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    built = subprocess.run(
        ["bash", str(REPO_ROOT / "deploy" / "build-image")], capture_output=True, text=True, timeout=3600
    )
    if built.returncode == 3:
        pytest.skip(f"the deployment images cannot be built here: {built.stderr.strip()[-300:]}")
    assert built.returncode == 0, built.stderr[-3000:]
    return dict(line.split("=", 1) for line in built.stdout.splitlines() if "=" in line)


@contextmanager
def running_stack(workdir: Path) -> Iterator[Stack]:
    """The stack up with the README's commands (init, up -d) on localhost, answering over https; then down."""
    images = build_images()
    port = free_port()
    env_file = workdir / "stack.env"
    # the settings file's own secrets, never this test process's key (compose prefers the shell's variables)
    env = {name: value for name, value in podman_env().items() if name != "SECRET_KEY"}
    made = subprocess.run(
        ["bash", str(COMPOSE_DIR / "init"), "--host", "localhost", "--https-port", str(port),
         "--env-file", str(env_file), "--certs", str(workdir / "certs")],
        env={**env, "HTTPS_BIND": "127.0.0.1", "HTTP_PORT": str(free_port()), **images},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    with env_file.open("a") as settings_file:  # a shorter drain than production's: the roll test waits for it
        settings_file.write("WEB_DRAIN_DEADLINE_S=20\n")
    plane = Stack(
        f"ctdeploy{uuid.uuid4().hex[:8]}", env_file, f"https://localhost:{port}", workdir / "certs" / "ca.crt", env
    )
    try:
        up = plane.compose("up", "-d")
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        wait_until(lambda: healthy(plane), timeout=180, interval=1, what="the stack answering over https")
        yield plane
    finally:
        down = plane.compose("down", "-v", "-t", "3")
        if down.returncode != 0:  # leave nothing behind: whatever compose could not remove
            for name in plane.names():
                plane.podman("rm", "-f", "-t", "0", name)
            for volume in ("pgdata", "redisdata"):
                plane.podman("volume", "rm", "-f", f"{plane.project}_{volume}")
            plane.podman("network", "rm", "-f", f"{plane.project}_default")


def healthy(plane: Stack) -> bool:
    """The stack answers over https and its worker consumes (heartbeat in /healthz)."""
    try:
        answer = requests.get(f"{plane.url}/healthz", verify=str(plane.ca), timeout=5)
    except requests.RequestException:
        return False
    return answer.status_code == 200 and answer.json()["dispatch"]["workers_alive"] >= 1


def dispatch_and_wait(plane: Stack, node_id: str, model: str) -> str:
    """Send model.download to the node from inside the stack; the command's final status."""
    code = f"""
import time
from fleet import services
from fleet.models import Node
node = Node.objects.get(pk="{node_id}")
owner = node.cluster.workspace.memberships.get(role="owner").user
(command,) = services.command_dispatch(actor=owner, cluster=node.cluster, command_type="model.download",
                                       payload={{"model_id": "{model}"}}, node=node)
deadline = time.time() + 60
while time.time() < deadline:
    command.refresh_from_db()
    if command.status in ("succeeded", "failed"):
        break
    time.sleep(0.5)
print(command.status)
"""
    return plane.shell(code)


def start_endpoint(plane: Stack, node_id: str, model: str) -> str:
    """Start an endpoint for a cached model on the node from inside the stack; JSON of its status, URL,
    failure and an API token of the workspace's owner."""
    code = f"""
import json, time
from rest_framework.authtoken.models import Token
from fleet.models import Node
from fleet.workloads import services
node = Node.objects.get(pk="{node_id}")
owner = node.cluster.workspace.memberships.get(role="owner").user
endpoint = services.endpoint_create(actor=owner, cluster=node.cluster, model_id="{model}", node=node)
deadline = time.time() + 60
while time.time() < deadline and endpoint.status not in ("running", "failed"):
    time.sleep(0.5)
    endpoint.refresh_from_db()
token, _ = Token.objects.get_or_create(user=owner)
print(json.dumps({{"status": endpoint.status, "url": endpoint.url, "failure": endpoint.failure_message,
                  "token": token.key}}))
"""
    return plane.shell(code)

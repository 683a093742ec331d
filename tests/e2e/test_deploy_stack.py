"""The one-machine stack of deploy/compose, run by podman-compose from the images deploy/build-image makes:
it comes up behind TLS from a local CA, an agent joins through https:// verifying that CA and goes
online, and a worker killed inside the stack is started again by its restart policy and dispatches
commands again.

Skipped (with the reason) where the stack cannot run: not root, no Podman, no podman-compose, or images
that cannot be built here (deploy/build-image exit 3). `.ci/test` builds the images first (cached).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.support.hub_standin import HubStandin
from tests.support.live import agent_join, agent_run
from tests.support.processes import REPO_ROOT, VENV_BIN, free_port, wait_until

pytestmark = pytest.mark.integration

COMPOSE_FILE = REPO_ROOT / "deploy" / "compose" / "compose.yaml"
PODMAN_DIR = Path(os.environ.get("CLEVERTHIS_PODMAN_DIR", "/var/tmp/cleverthis-podman"))
PODMAN_ENV = {
    "CONTAINERS_CONF": str(PODMAN_DIR / "containers.conf"),
    "CONTAINERS_STORAGE_CONF": str(PODMAN_DIR / "storage.conf"),
    "CONTAINERS_REGISTRIES_CONF": str(PODMAN_DIR / "registries.conf"),
}


@dataclass
class Stack:
    """A running compose project: its URL, the local CA that signed its certificate, its containers."""

    project: str
    env_file: Path
    url: str
    ca: Path
    env: dict[str, str]

    def container(self, service: str, number: int = 1) -> str:
        return f"{self.project}_{service}_{number}"

    def podman(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout)

    def manage(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """A manage.py command in the first web container."""
        return self.podman("exec", self.container("web"), "cleverthis", "manage", *args, timeout=timeout)

    def shell(self, code: str, timeout: float = 120) -> str:
        done = self.manage("shell", "-c", code, timeout=timeout)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout.strip().splitlines()[-1]  # after Django's shell's "N objects imported" line

    def compose(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        argv = [str(VENV_BIN / "podman-compose"), "-p", self.project, "-f", str(COMPOSE_FILE)]
        argv += ["--env-file", str(self.env_file), *args]
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)

    def logs(self) -> str:
        names = self.podman(
            "ps", "-a", "--filter", f"label=io.podman.compose.project={self.project}", "--format", "{{.Names}}"
        ).stdout.split()
        return "\n".join(f"--- {n}\n{self.podman('logs', '--tail', '30', n).stderr[-3000:]}" for n in names)


def build_images() -> dict[str, str]:
    if os.geteuid() != 0:
        pytest.skip("the deployment stack needs root (rootful Podman)")
    if shutil.which("podman") is None:
        pytest.skip("Podman is not installed (.ci/podman-setup installs it)")
    if not (VENV_BIN / "podman-compose").exists():
        pytest.skip("podman-compose is not installed (requirements/dev.txt)")
    built = subprocess.run(
        ["bash", str(REPO_ROOT / "deploy" / "build-image")], capture_output=True, text=True, timeout=3600
    )
    if built.returncode == 3:
        pytest.skip(f"the deployment images cannot be built here: {built.stderr.strip()[-300:]}")
    assert built.returncode == 0, built.stderr[-3000:]
    return dict(line.split("=", 1) for line in built.stdout.splitlines() if "=" in line)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    images = build_images()
    port = free_port()
    env_file = tmp_path / "stack.env"
    env = {**os.environ, **PODMAN_ENV, "HTTPS_BIND": "127.0.0.1", "HTTP_PORT": str(free_port()), **images}
    made = subprocess.run(
        ["bash", str(REPO_ROOT / "deploy" / "compose" / "init"), "--host", "localhost", "--https-port", str(port),
         "--env-file", str(env_file), "--certs", str(tmp_path / "certs")],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    # a lost node goes offline sooner than in production (beat checks every 15 s)
    env_file.write_text(env_file.read_text() + "NODE_OFFLINE_AFTER_S=20\n")
    plane = Stack(
        f"ctdeploy{uuid.uuid4().hex[:8]}", env_file, f"https://localhost:{port}", tmp_path / "certs" / "ca.crt", env
    )
    try:
        up = plane.compose("up", "-d")
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        wait_until(lambda: healthy(plane), timeout=180, interval=1, what="the stack answering over https")
        yield plane
    finally:
        down = plane.compose("down", "-v", "-t", "3")
        if down.returncode != 0:  # leave nothing behind: whatever compose could not remove
            leftovers = plane.podman("ps", "-aq", "--filter", f"label=io.podman.compose.project={plane.project}")
            for cid in leftovers.stdout.split():
                plane.podman("rm", "-f", "-t", "0", cid)
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


def pid_of(plane: Stack, container: str) -> int:
    return int(plane.podman("inspect", "--format", "{{.State.Pid}}", container).stdout.strip() or 0)


def dispatch_and_wait(plane: Stack, node_id: str, model: str) -> str:
    """Send model.download to the node from inside the stack; the command's final status."""
    code = f"""
import time
from fleet import services
from fleet.models import Command, Node
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


def test_stack_serves_tls_an_agent_joins_and_a_killed_worker_comes_back(stack: Stack, tmp_path: Path):
    # TLS from the local CA; a client that does not trust it is refused
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{stack.url}/healthz", timeout=5, verify=True)
    # a host that is neither the control plane nor a node origin is not served
    assert requests.get(f"{stack.url}/healthz", headers={"Host": "elsewhere.test"}, verify=str(stack.ca),
                        timeout=5).status_code == 404  # fmt: skip
    # two web replicas behind the proxy, exactly one beat
    assert stack.podman("container", "exists", stack.container("web", 2)).returncode == 0
    assert stack.podman("container", "exists", stack.container("beat", 2)).returncode != 0
    # the health checks the compose file declares pass (Podman without systemd runs them only when asked)
    for service in ("web", "worker"):
        checked = stack.podman("healthcheck", "run", stack.container(service))
        assert checked.returncode == 0, f"{service}: {checked.stdout}{checked.stderr}"

    stack.manage("bootstrap_demo")
    token = stack.manage("local_node_token", "--state-dir", "/tmp/none", "--url", stack.url).stdout.strip()
    assert token, stack.logs()
    # the agent trusts exactly the local CA: its certificate verification is real
    tls_env = {"SSL_CERT_FILE": str(stack.ca), "REQUESTS_CA_BUNDLE": str(stack.ca)}
    state = tmp_path / "agent"
    joined = agent_join(stack.url, token, state, env=tls_env)
    assert joined.returncode == 0, joined.stderr
    node_id = json.loads((state / "node.json").read_text())["node_id"]
    hub = HubStandin().start()
    hub.add_repo("acme/tiny", {"config.json": b"{}"})
    hub.add_repo("acme/again", {"config.json": b"{}"})
    models = str(tmp_path / "models")
    agent = agent_run(state, tmp_path, env={**tls_env, "HF_ENDPOINT": hub.url, "CLEVERTHIS_MODEL_CACHE": models})
    try:
        wait_until(lambda: "connected to" in agent.log(), timeout=60, interval=0.5, what="the agent's tunnel")
        assert stack.shell(f'from fleet.models import Node; print(Node.objects.get(pk="{node_id}").status)') == "online"
        assert dispatch_and_wait(stack, node_id, "acme/tiny") == "succeeded"

        worker = stack.container("worker")
        before = pid_of(stack, worker)
        os.kill(before, signal.SIGKILL)  # the worker dies (as an OOM kill would): its restart policy brings it back
        wait_until(lambda: pid_of(stack, worker) not in (0, before), timeout=60, interval=0.5, what="worker restarted")
        started = time.monotonic()
        assert dispatch_and_wait(stack, node_id, "acme/again") == "succeeded", agent.log()[-2000:]
        print(f"a command after the worker's restart took {time.monotonic() - started:.1f} s")
    finally:
        agent.stop()
        hub.stop()

"""A booted node for end-to-end tests: a Debian container with systemd as PID 1, run by Podman.

`.ci/node-image` builds the image (debootstrap, cached by recipe hash) and a wheelhouse of the agent's
dependencies; both are read here. The container shares the host's network, so it reaches a web server on
127.0.0.1 exactly as a node reaches its control plane, and gets the Podman service of
`.ci/podman-setup` as its Docker engine: that service's Docker API socket is bind-mounted at
/run/docker.sock, where the docker CLI and the agent's Docker SDK look by default.
"""

from __future__ import annotations

import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.podman_env import podman_env
from tests.support.processes import REPO_ROOT, wait_until

WHEELHOUSE_IN_NODE = "/srv/wheels"
# pip inside the node installs from the wheelhouse only: nothing is downloaded while tests run.
PIP_ARGS = f"--no-index --find-links {WHEELHOUSE_IN_NODE}"
LABEL = "io.cleverthis.test=node-container"
# A container left behind by a killed test run stops (and is removed) by itself after this long.
MAX_LIFETIME_S = 1800
EXIT_CANNOT_BUILD = 3  # .ci/node-image: not root, or no podman


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        ["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done


def node_image() -> tuple[str, Path]:
    """Build (or find cached) the node image and wheelhouse; skip where they cannot be built."""
    done = subprocess.run(
        ["bash", str(REPO_ROOT / ".ci/node-image")], capture_output=True, text=True, timeout=900, check=False
    )
    if done.returncode == EXIT_CANNOT_BUILD:
        pytest.skip(f"no node image: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, f".ci/node-image failed:\n{done.stderr[-4000:]}"
    values = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    return values["NODE_IMAGE"], Path(values["NODE_WHEELHOUSE"])


@dataclass
class NodeContainer:
    """One booted node; `remove()` stops and deletes it."""

    name: str
    hostname: str

    @classmethod
    def boot(cls, image: str, *, wheelhouse: Path, docker_socket: Path | None) -> NodeContainer:
        suffix = uuid.uuid4().hex[:8]
        box = cls(name=f"cleverthis-node-{suffix}", hostname=f"e2e-node-{suffix}")
        mounts = ["-v", f"{wheelhouse}:{WHEELHOUSE_IN_NODE}:ro"]
        if docker_socket is not None:
            mounts += ["-v", f"{docker_socket}:/run/docker.sock"]
        podman(
            "run",
            "--detach",
            "--rm",
            f"--timeout={MAX_LIFETIME_S}",
            f"--name={box.name}",
            f"--label={LABEL}",
            "--systemd=always",
            "--network=host",
            "--uts=private",
            f"--hostname={box.hostname}",
            *mounts,
            image,
        )
        try:
            wait_until(lambda: box.system_state() in ("running", "degraded"), timeout=60, what="systemd booted")
            assert box.system_state() == "running", box.sh("systemctl --failed --no-pager").stdout
        except BaseException:
            box.remove()
            raise
        return box

    def system_state(self) -> str:
        return self.sh("systemctl is-system-running", timeout=30).stdout.strip()

    def sh(
        self, script: str, *, env: dict[str, str] | None = None, user: str | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Run `sh -c script` in the node (as root unless `user`), as an operator's shell would."""
        options = [f"--env={key}={value}" for key, value in (env or {}).items()]
        if user:
            options.append(f"--user={user}")
        return podman("exec", *options, self.name, "sh", "-c", script, timeout=timeout, check=False)

    def systemctl(self, *args: str) -> str:
        """`systemctl ARGS` output (stdout), whatever its exit status."""
        return self.sh("systemctl " + " ".join(args), timeout=60).stdout.strip()

    def unit_properties(self, unit: str, *names: str) -> dict[str, str]:
        out = self.systemctl("show", unit, *(f"--property={name}" for name in names))
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, unit: str) -> str:
        """The unit's messages, as `journalctl -u UNIT` shows them (message text only)."""
        return self.sh(f"journalctl -u {unit} --no-pager -o cat", timeout=60).stdout

    def remove(self) -> None:
        podman("rm", "--force", "--time=0", self.name, check=False)

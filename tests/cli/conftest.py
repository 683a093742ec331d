"""Fixtures for the command line's end-to-end tests: the live control plane, workspace, cluster, agents and
Hub stand-in of tests/e2e, plus an API key and a `ctfleet` runner with its own config file."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.conftest import agents, cluster, control_plane, hub, operator  # noqa: F401
from tests.support.processes import REPO_ROOT, VENV_BIN, clean_environ

CTFLEET = str(VENV_BIN / "ctfleet")


@dataclass
class Ran:
    code: int
    out: str
    err: str


@dataclass
class Ctfleet:
    """Runs the installed `ctfleet` command as a user would, with a config file of its own."""

    home: Path
    env: dict[str, str]

    def __call__(self, *args: str, timeout: float = 120, env: dict[str, str] | None = None) -> Ran:
        done = subprocess.run(
            [CTFLEET, *args],
            cwd=REPO_ROOT,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        return Ran(done.returncode, done.stdout, done.stderr)

    def popen(self, *args: str, log: Path) -> subprocess.Popen:
        return subprocess.Popen(
            [CTFLEET, *args],
            cwd=REPO_ROOT,
            env=self.env,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


@pytest.fixture
def api_key(operator):  # noqa: F811
    from fleet.workloads import services as workload_services

    user, workspace = operator
    key, raw = workload_services.api_key_create(
        actor=user, workspace=workspace, name="cli", scopes=["read", "operate", "invoke"]
    )
    return key, raw


@pytest.fixture
def ctfleet(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in clean_environ().items() if not k.startswith("CTFLEET_")}
    env.update({"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "PYTHONUNBUFFERED": "1"})
    env.pop("DJANGO_SETTINGS_MODULE", None)
    assert os.path.exists(CTFLEET), "install the client: pip install -e ./client (.ci/setup does)"
    return Ctfleet(home, env)

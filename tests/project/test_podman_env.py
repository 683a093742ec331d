"""Containers start from a test process whose open-file hard limit is lower than `.ci/podman-setup`'s shell's.

runc cannot give a container more than the hard limit of the process that starts it, so a podman CLI run
from such a process failed with "error setting rlimit type 7: operation not permitted" until
`tests.support.podman_env` fitted the configuration to it (raising the process's limit where the machine
lets root do that, else a copy of the configuration with the process's own limit).
"""

from __future__ import annotations

import re
import resource
import shutil
import subprocess
import sys

import pytest

from tests.agent.executors.podman import STATE_DIR, TEST_IMAGE, require_podman
from tests.support.processes import REPO_ROOT

pytestmark = pytest.mark.integration

RUN_ONE = f"""
import resource, subprocess
from tests.support.podman_env import podman_env
env = podman_env()
print("own", resource.getrlimit(resource.RLIMIT_NOFILE)[1], end=" ")
done = subprocess.run(["podman", "run", "--rm", "{TEST_IMAGE}", "sh", "-c", "ulimit -Hn"], env=env,
                      capture_output=True, text=True, timeout=120)
print("rc", done.returncode, "hard", done.stdout.strip(), done.stderr.strip()[-500:])
"""


def configured_nofile() -> int:
    found = re.search(r'"nofile=\d+:(\d+)"', (STATE_DIR / "containers.conf").read_text())
    assert found, "containers.conf sets no nofile limit"
    return int(found[1])


@pytest.fixture
def podman_conf() -> int:
    require_podman()
    if shutil.which("prlimit") is None:
        pytest.skip("prlimit (util-linux) is not installed")
    return configured_nofile()


def test_a_process_with_a_lower_hard_limit_than_the_configured_one_starts_containers(podman_conf):
    lowered = podman_conf // 2
    argv = ["prlimit", f"--nofile={lowered}:{lowered}", sys.executable, "-c", RUN_ONE]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    found = re.fullmatch(r"own (\d+) rc (\d+) hard (\d+) ?(.*)", done.stdout.strip(), re.S)
    assert found, done.stdout
    own, rc, container = int(found[1]), int(found[2]), int(found[3])
    assert rc == 0, found[4]
    # raised back to the configured limit where root may, else the process's own
    assert own in (lowered, podman_conf)
    assert container == own


def test_a_process_at_the_configured_limit_uses_the_setup_file_itself(podman_conf):
    from tests.support.podman_env import containers_conf

    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < podman_conf:
        pytest.skip("this test process's own hard limit is below the configured one")
    assert containers_conf() == STATE_DIR / "containers.conf"

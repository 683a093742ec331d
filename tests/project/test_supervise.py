"""`.ci/supervise` (used by .ci/up and the Procfile): a process that dies is started again after a growing
back-off and each restart is logged; SIGTERM stops the process and the supervisor, with no restart."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from tests.support.processes import REPO_ROOT, wait_until

SUPERVISE = REPO_ROOT / ".ci" / "supervise"


def _start(tmp_path, *command: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", str(SUPERVISE), "dummy", *command],
        stderr=(tmp_path / "supervise.log").open("wb"),
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen) -> int:
    """SIGTERM to the supervisor alone (as .ci/up's clean-up sends it); its exit status."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_process_that_dies_is_restarted_with_a_growing_back_off(tmp_path):
    runs = tmp_path / "runs"
    proc = _start(tmp_path, "sh", "-c", f"echo run >> {runs}; exit 3")
    try:
        wait_until(lambda: runs.exists() and len(runs.read_text().split()) >= 3, timeout=20, what="two restarts")
    finally:
        # stopped while waiting to restart (0), or in the instant the process runs (its status)
        assert _stop(proc) in (0, 3, 128 + signal.SIGTERM)
    log = (tmp_path / "supervise.log").read_text()
    assert "[supervise] dummy exited with status 3 after 0 s; restart 1 in 1 s" in log
    assert "restart 2 in 2 s" in log
    count = len(runs.read_text().split())
    time.sleep(2.5)
    assert len(runs.read_text().split()) == count  # nothing restarts it once stopped


def test_sigterm_stops_the_process_and_the_supervisor(tmp_path):
    pid_file = tmp_path / "pid"
    proc = _start(tmp_path, "sh", "-c", f"echo $$ > {pid_file}; exec sleep 300")
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip().isdigit(), timeout=10, what="child")
    child = int(pid_file.read_text())
    assert _stop(proc) == 128 + signal.SIGTERM  # the process's own status
    try:
        os.kill(child, 0)
    except ProcessLookupError:
        pass
    else:
        raise AssertionError("the supervised process outlived its supervisor")
    assert "restart" not in (tmp_path / "supervise.log").read_text()


def test_back_off_is_capped(tmp_path):
    runs = tmp_path / "runs"
    proc = _start(tmp_path, "sh", "-c", f"echo run >> {runs}; exit 1", env={"SUPERVISE_MAX_BACKOFF_S": "1"})
    try:
        wait_until(lambda: runs.exists() and len(runs.read_text().split()) >= 4, timeout=20, what="three restarts")
    finally:
        _stop(proc)
    log = (tmp_path / "supervise.log").read_text()
    assert "restart 3 in 1 s" in log

"""EndpointManager's failure races with real processes (the stand-in server): a stop during a start cancels
it and leaves no server, a server the agent no longer owns is reported `stray` and ended by its stop, and
each CPU server is bound to cores of its own."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest

from agent.errors import CommandFailed
from agent.protocol import EndpointStartPayload, EndpointStopPayload
from agent.workloads.cpu_cores import allocate_cores, cpu_list, node_cores
from agent.workloads.endpoint_records import STATE_FILE
from agent.workloads.endpoints import EndpointManager
from agent.workloads.server_process import pid_alive
from tests.agent.workloads import test_endpoints
from tests.agent.workloads.test_endpoints import MODEL, quiet
from tests.support.processes import wait_until

# EndpointManager with the stand-in server, as the manager's own tests use it
cached_models = test_endpoints.cached_models
manager = test_endpoints.manager

# A server that never answers: its start stays in flight until stopped or timed out.
HANG = [sys.executable, "-c", "import time; time.sleep(120)"]


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_a_stop_during_a_start_cancels_it_and_leaves_no_server(cached_models, tmp_path):
    manager = EndpointManager(cached_models, tmp_path, server_command=HANG, ready_timeout_s=60, stop_timeout_s=2)
    outcome: list[object] = []

    def start() -> None:
        try:
            outcome.append(manager.start(EndpointStartPayload(endpoint_id="race1", model_id=MODEL), quiet))
        except CommandFailed as exc:
            outcome.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    try:
        wait_until(lambda: [e.status for e in manager.inventory()] == ["starting"], timeout=20, what="start")
        pid = manager.inventory()[0].pid
        assert manager.stop(EndpointStopPayload(endpoint_id="race1")).status == "stopped"
        thread.join(timeout=20)
        [failed] = outcome
        assert isinstance(failed, CommandFailed), failed
        assert failed.code == "conflict"
        assert "stopped while it was starting" in failed.message
        assert not pid_alive(pid)
        assert manager.inventory() == []
        # the stop's record stays: a repeated stop answers stopped again (not not_found)
        assert manager.stop(EndpointStopPayload(endpoint_id="race1")).status == "stopped"
    finally:
        manager.stop_all()
        thread.join(timeout=20)


def test_a_server_the_agent_does_not_own_is_reported_stray_and_ended_by_its_stop(manager):
    result = manager.start(EndpointStartPayload(endpoint_id="lost1", model_id=MODEL), quiet)
    state_path = manager.state_dir / STATE_FILE
    state_path.write_text(json.dumps({}))  # its record is lost (the leak: a start nobody owns any more)

    [info] = manager.inventory()
    assert (info.endpoint_id, info.status, info.pid, info.port, info.model_id) == (
        "lost1",
        "stray",
        result.pid,
        result.port,
        MODEL,
    )
    assert manager.inventory(strays=False) == []
    assert manager.stop(EndpointStopPayload(endpoint_id="lost1")).status == "stopped"
    assert not pid_alive(result.pid)
    assert manager.inventory() == []


def test_each_cpu_server_is_bound_to_cores_of_its_own(manager):
    cores = node_cores()
    assert len(cores) >= 2, "this test needs a node with two cores"
    old = manager.start(EndpointStartPayload(endpoint_id="bind1", model_id=MODEL), quiet)
    new = manager.start(EndpointStartPayload(endpoint_id="bind2", model_id=MODEL), quiet)  # e.g. its replacement
    old_env, new_env = environ_of(old.pid), environ_of(new.pid)
    assert old_env["VLLM_CPU_OMP_THREADS_BIND"] != new_env["VLLM_CPU_OMP_THREADS_BIND"]
    assert (old_env["OMP_NUM_THREADS"], new_env["OMP_NUM_THREADS"]) == ("1", "1")
    assert os.sched_getaffinity(old.pid).isdisjoint(os.sched_getaffinity(new.pid))
    assert cpu_list(sorted(os.sched_getaffinity(new.pid))) == new_env["VLLM_CPU_OMP_THREADS_BIND"]

    manager.stop(EndpointStopPayload(endpoint_id="bind1"))  # its core is free again
    third = manager.start(EndpointStartPayload(endpoint_id="bind3", model_id=MODEL), quiet)
    assert environ_of(third.pid)["VLLM_CPU_OMP_THREADS_BIND"] == old_env["VLLM_CPU_OMP_THREADS_BIND"]


@pytest.mark.parametrize(
    ("held", "count", "expected"),
    [([], 1, [0]), ([[0]], 1, [1]), ([[0], [1]], 1, [2]), ([[0], [1], [2], [3]], 1, [0]), ([[1]], 2, [0, 2])],
)
def test_cores_are_given_free_ones_first_then_the_least_shared(held, count, expected):
    assert allocate_cores(held, cores=[0, 1, 2, 3], count=count) == expected


def test_cpu_lists_take_libnumas_form():
    assert [cpu_list(c) for c in ([0], [0, 1, 2, 5], [0, 2, 3])] == ["0", "0-2,5", "0,2-3"]

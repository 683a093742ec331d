"""The agent's Ray runtimes: the docker container spec (pure) and the `process` runtime against real Ray."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.ray.docker_spec import docker_run_spec
from agent.ray.gcs import NODE_LABEL, RayClusterStatus
from agent.ray.ports import ephemeral_port_range, free_port, worker_port_window
from agent.ray.process_runtime import RayNodeProcess, RayProcessRuntime, RayRuntimeError, session_pids
from agent.ray.start_args import ray_start_args
from agent.ray.versions import agent_ports_need_pinning
from raymgr.autoscaler import ClusterDemand, ScalingPolicy, WorkerState, decide
from tests.support.processes import VENV_BIN, wait_until

RAY_BIN = VENV_BIN / "ray"


# --- pure: ray start arguments and the docker spec --------------------------------------------------


def test_head_args_always_name_the_gcs_port():
    with pytest.raises(ValueError, match="6379"):
        ray_start_args(role="head", num_cpus=1)
    args = ray_start_args(role="head", gcs_port=40001, dashboard_port=40002, num_cpus=1, temp_dir="/tmp/r")
    assert args[:3] == ["start", "--block", "--disable-usage-stats"]
    assert "--head" in args
    assert "--port=40001" in args
    assert "--dashboard-port=40002" in args
    assert "--num-cpus=1" in args
    assert "--temp-dir=/tmp/r" in args


def test_worker_args_join_the_head_with_resources_and_labels():
    with pytest.raises(ValueError, match="head"):
        ray_start_args(role="worker", num_cpus=1)
    args = ray_start_args(
        role="worker",
        head_address="10.0.0.5:40001",
        num_cpus=2,
        num_gpus=1,
        resources={"accel": 2},
        labels={"b": "2", "a": "1"},
        dashboard_agent_listen_port=40010,
    )
    assert "--address=10.0.0.5:40001" in args
    assert "--head" not in args
    assert not any(a.startswith("--port=") for a in args)
    assert "--num-gpus=1" in args
    assert '--resources={"accel": 2}' in args
    assert "--labels=a=1,b=2" in args
    assert "--dashboard-agent-listen-port=40010" in args


def test_docker_spec_for_a_cpu_head_on_host_network():
    spec = docker_run_spec("head", "2.60.0", False, None, {"gcs": 6380, "dashboard": 8266}, name="rc-1-head")
    assert spec["image"] == "rayproject/ray:2.60.0"
    assert spec["network_mode"] == "host"
    assert "ports" not in spec
    assert "device_requests" not in spec
    cmd = spec["command"]
    assert cmd[:4] == ["ray", "start", "--block", "--disable-usage-stats"]
    assert "--head" in cmd
    assert "--port=6380" in cmd
    assert "--dashboard-port=8266" in cmd
    assert "--dashboard-host=0.0.0.0" in cmd
    assert "--ray-client-server-port=10001" in cmd
    assert f"--labels={NODE_LABEL}=rc-1-head" in cmd
    assert spec["labels"]["cleverthis.ray.role"] == "head"
    json.dumps(spec)  # travels over the wire as JSON


def test_docker_spec_for_a_gpu_worker():
    spec = docker_run_spec("worker", "2.60.0", True, "10.0.0.5:6380", None, name="w1", num_gpus=1, python_tag="py311")
    assert spec["image"] == "rayproject/ray:2.60.0-py311-gpu"
    assert spec["device_requests"] == [{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}]
    cmd = spec["command"]
    assert "--address=10.0.0.5:6380" in cmd
    assert "--head" not in cmd
    assert "--num-gpus=1" in cmd
    assert not any(a.startswith("--dashboard-port") for a in cmd)


def test_agent_ports_are_pinned_on_ray_releases_that_draw_them_racily():
    assert agent_ports_need_pinning("2.9.0")
    assert agent_ports_need_pinning("2.59.1")
    assert not agent_ports_need_pinning("2.60.0")  # binds port 0 itself
    assert not agent_ports_need_pinning("3.0.0")
    args = ray_start_args(
        role="worker",
        head_address="10.0.0.5:40001",
        dashboard_agent_grpc_port=20001,
        runtime_env_agent_port=20002,
        metrics_export_port=20003,
    )
    assert "--dashboard-agent-grpc-port=20001" in args
    assert "--runtime-env-agent-port=20002" in args
    assert "--metrics-export-port=20003" in args
    bare = ray_start_args(role="worker", head_address="10.0.0.5:40001")
    assert not any(a.startswith(("--runtime-env", "--metrics-export", "--dashboard-agent-grpc")) for a in bare)


def test_docker_spec_passes_the_agent_ports_on_the_host_network_only():
    ports = {"gcs": 6380, "dashboard": 8266, "dashboard_agent_grpc": 20011, "runtime_env_agent": 20012}
    cmd = docker_run_spec("head", "2.9.0", False, None, {**ports, "metrics_export": 20013})["command"]
    assert "--dashboard-agent-grpc-port=20011" in cmd
    assert "--runtime-env-agent-port=20012" in cmd
    assert "--metrics-export-port=20013" in cmd
    assert '--labels={"' + NODE_LABEL + '":"ray-head"}' in cmd  # Ray 2.9 reads labels as JSON
    cmd = docker_run_spec("head", "2.9.0", False, None, ports)["command"]
    assert not any(a.startswith("--metrics-export") for a in cmd)  # not given: Ray picks it
    bridged = docker_run_spec("head", "2.9.0", False, None, ports, network="bridge")["command"]
    assert not any(a.startswith(("--runtime-env", "--dashboard-agent-grpc")) for a in bridged)


def test_free_port_stays_out_of_the_ephemeral_range_and_rays_worker_ports():
    low, high = ephemeral_port_range()
    assert 0 < low <= high
    for _ in range(50):
        port = free_port()
        assert not low <= port <= high
        assert port >= 20000
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free indeed


def test_free_port_skips_a_port_someone_listens_on(monkeypatch: pytest.MonkeyPatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        monkeypatch.setattr("agent.ray.ports.ephemeral_port_range", lambda: (busy + 1, 65535))
        monkeypatch.setattr("agent.ray.ports.LISTEN_PORTS_FROM", busy)
        # The only candidate is taken: it falls back to a port the kernel picks.
        assert free_port(attempts=5) != busy


def test_each_node_gets_a_worker_port_window_off_rays_shared_defaults(monkeypatch: pytest.MonkeyPatch):
    starts = set()
    for _ in range(50):
        window = worker_port_window()
        assert window is not None
        low, high = window
        assert high - low + 1 == 1000
        assert 11000 <= low
        assert high <= 19999
        starts.add(low)
    assert len(starts) > 1  # random: two nodes rarely walk the same ports
    args = ray_start_args(role="worker", head_address="10.0.0.5:40001", worker_ports=(12000, 12999))
    assert "--min-worker-port=12000" in args
    assert "--max-worker-port=12999" in args
    monkeypatch.setattr("agent.ray.ports.ephemeral_port_range", lambda: (11500, 60999))
    assert worker_port_window() is None  # no room below the ephemeral range: Ray's defaults


def test_docker_spec_gives_workers_their_window_and_serve_proxies_time():
    ports = {"gcs": 6380, "dashboard": 8266, "min_worker": 15000, "max_worker": 15999}
    spec = docker_run_spec("head", "2.9.0", False, None, ports)
    assert "--min-worker-port=15000" in spec["command"]
    assert "--max-worker-port=15999" in spec["command"]
    # Serve's 5 s for a new HTTP proxy's first ready check fails serve.start on a busy machine.
    assert float(spec["environment"]["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"]) > 5
    assert spec["environment"]["RAY_USAGE_STATS_ENABLED"] == "0"
    bridged = docker_run_spec("head", "2.9.0", False, None, ports, network="bridge")["command"]
    assert not any(a.startswith("--min-worker-port") for a in bridged)  # its own network: Ray's defaults


def test_docker_spec_bridge_network_publishes_gcs_and_dashboard():
    spec = docker_run_spec("head", "2.60.0", False, None, {"gcs": 16379, "dashboard": 18265}, network="bridge")
    assert spec["ports"] == {"6379/tcp": 16379, "8265/tcp": 18265}
    assert "network_mode" not in spec
    assert "--port=6379" in spec["command"]  # Ray's default, inside the container only


def test_docker_spec_refuses_bad_input():
    with pytest.raises(ValueError, match="head's address"):
        docker_run_spec("worker", "2.60.0", False, None)
    with pytest.raises(ValueError, match="role"):
        docker_run_spec("driver", "2.60.0", False, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="network"):
        docker_run_spec("head", "2.60.0", False, None, network="overlay")  # type: ignore[arg-type]


def test_stop_never_touches_a_process_it_did_not_start(tmp_path: Path):
    """A session leader that is not our Ray (wrong temp dir in its command line) survives `stop`."""
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        runtime = RayProcessRuntime(RAY_BIN, tmp_path)
        fake = RayNodeProcess(
            name="x",
            role="worker",
            pid=stranger.pid,
            gcs_address="127.0.0.1:1",
            temp_dir="/tmp/not-ours",
            log_path="",
            ports={},
        )
        assert runtime.processes(fake) == []
        runtime.stop(fake, grace_s=0.5)
        assert stranger.poll() is None
        assert session_pids(stranger.pid) == [stranger.pid]
    finally:
        stranger.kill()
        stranger.wait()


def test_start_head_refuses_redis_port(tmp_path: Path):
    with pytest.raises(ValueError, match="Redis"):
        RayProcessRuntime(RAY_BIN, tmp_path).start_head(gcs_port=6379, dashboard_port=free_port(), num_cpus=1)


# --- real Ray ------------------------------------------------------------------------------------

DRIVER = """
import os, sys, time, ray
ray.init(address=sys.argv[1])
release = sys.argv[2]

@ray.remote(num_cpus=1)
def hold():
    while not os.path.exists(release):
        time.sleep(0.2)
    return "released"

@ray.remote(num_cpus=1)
def quick():
    return ray.get_runtime_context().get_node_id()

blocker = hold.remote()
time.sleep(1)  # let the blocker take the head's only CPU first
waiting = quick.remote()
print("SUBMITTED", flush=True)
print("QUICK", ray.get(waiting, timeout=120), flush=True)
print("HOLD", ray.get(blocker, timeout=120), flush=True)
"""


PG_DRIVER = """
import sys, time, ray
from ray.util.placement_group import placement_group
ray.init(address=sys.argv[1])
group = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="PACK")
time.sleep(120)
"""


def as_autoscaler_input(status: RayClusterStatus, shape: dict[str, float]) -> tuple[list[WorkerState], ClusterDemand]:
    """What the control plane feeds `decide()` from the agent's report (the field mapping the lead reuses)."""
    workers = [
        WorkerState(
            worker_id=node.name or node.node_id,
            idle_s=node.idle_s,
            resources=node.resources,
            draining=node.draining,
            available=node.available,
        )
        for node in status.workers
    ]
    return workers, ClusterDemand(pending=status.demand.bundles, head_free=status.head_free, worker_shape=shape)


def our_processes(temp_dirs: list[str]) -> list[int]:
    """Every process on the machine whose command line mentions one of our Ray temp dirs."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if any(d.encode() in cmdline for d in temp_dirs):
                found.append(int(entry))
    return found


@pytest.fixture
def ray_runtime(tmp_path: Path) -> Iterator[RayProcessRuntime]:
    runtime = RayProcessRuntime(RAY_BIN, tmp_path / "ray")
    try:
        yield runtime
    finally:
        runtime.stop_all()


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_process_runtime_scales_a_real_ray_cluster(ray_runtime: RayProcessRuntime, tmp_path: Path):
    shape = {"CPU": 1.0}
    policy = ScalingPolicy(min_workers=0, max_workers=2, idle_timeout_s=3)
    head = ray_runtime.start_head(gcs_port=free_port(), dashboard_port=free_port(), num_cpus=1)
    assert head.node_id
    assert head.gcs_address.endswith(f":{head.ports['gcs']}")
    assert head.ports["gcs"] != 6379
    status = ray_runtime.cluster_status(head.address)
    assert [n.is_head for n in status.nodes] == [True]
    assert status.head_free["CPU"] == 1.0
    assert status.demand.bundles == []

    release = tmp_path / "release"
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}", "RAY_USAGE_STATS_ENABLED": "0"}
    driver_log = (tmp_path / "driver.log").open("w+")
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, head.address, str(release)],
        stdout=driver_log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    worker = None
    try:
        # 1. Two 1-CPU tasks on a 1-CPU head: one runs, one is pending demand; decide() adds a worker.
        def pending() -> bool:
            current = ray_runtime.cluster_status(head.address)
            return current.demand.bundles == [{"CPU": 1.0}] and current.head_free.get("CPU") == 0.0

        wait_until(pending, timeout=60, interval=0.5, what="pending 1-CPU demand")
        workers, demand = as_autoscaler_input(ray_runtime.cluster_status(head.address), shape)
        decision = decide(policy, workers, demand)
        assert decision.add == 1, decision.reasons
        assert decision.remove == []

        # 2. Start the worker: the pending task runs on it.
        worker = ray_runtime.start_worker(
            head_address=head.address, num_cpus=1, dashboard_agent_listen_port=free_port(), name="w-autoscaled"
        )
        assert worker.node_id
        assert worker.node_id != head.node_id

        def driver_output() -> str:
            driver_log.flush()
            return (tmp_path / "driver.log").read_text()

        wait_until(lambda: "QUICK" in driver_output(), timeout=60, interval=0.5, what="the pending task to run")
        assert f"QUICK {worker.node_id}" in driver_output()
        # The head's demand report catches up within a few resource-report periods.
        wait_until(
            lambda: ray_runtime.cluster_status(head.address).demand.bundles == [],
            timeout=30,
            interval=0.5,
            what="the pending demand to clear",
        )
        # An idle drain is refused for a busy node (the head runs the blocker), so a raced decision is safe.
        accepted, message = ray_runtime.drain_worker(head.node_id, address=head.address)
        assert not accepted
        assert "idle" in message

        # 3. Release the blocker; once the worker has idled past the (short) timeout decide() removes it.
        release.touch()
        assert driver.wait(timeout=60) == 0, driver_output()

        def worker_idle_past_timeout() -> bool:
            node = ray_runtime.cluster_status(head.address).node_named("w-autoscaled")
            return node is not None and node.idle_s > policy.idle_timeout_s

        wait_until(worker_idle_past_timeout, timeout=60, interval=0.5, what="the worker to idle")
        workers, demand = as_autoscaler_input(ray_runtime.cluster_status(head.address), shape)
        decision = decide(policy, workers, demand)
        assert decision.add == 0
        assert decision.remove == ["w-autoscaled"], decision.reasons

        # 4. Drain it through the GCS (accepted while idle; the head, running nothing, is not ours to drain).
        accepted, message = ray_runtime.drain_worker(worker.node_id, address=head.address)
        assert accepted, message
        wait_until(
            lambda: ray_runtime.cluster_status(head.address).node_named("w-autoscaled") is None,
            timeout=60,
            interval=0.5,
            what="the drained worker to leave the cluster",
        )
        ray_runtime.stop(worker)
        assert ray_runtime.processes(worker) == []
        assert [n.is_head for n in ray_runtime.cluster_status(head.address).nodes] == [True]
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, 9)
            driver.wait()
        driver_log.close()

    # 5. A placement group (how Tune trials and Train workers ask) that exceeds capacity is demand too.
    pg_driver = subprocess.Popen(
        [sys.executable, "-c", PG_DRIVER, head.address],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:

        def pending_group() -> bool:
            return len(ray_runtime.cluster_status(head.address).demand.placement_groups) == 1

        wait_until(pending_group, timeout=60, interval=0.5, what="a pending placement group")
        status = ray_runtime.cluster_status(head.address)
        (group,) = status.demand.placement_groups
        assert group["strategy"] == "PACK"
        assert group["bundles"] == [{"CPU": 1.0}, {"CPU": 1.0}]
        assert status.demand.bundles == [{"CPU": 1.0}, {"CPU": 1.0}]
        workers, demand = as_autoscaler_input(status, shape)
        assert decide(policy, workers, demand).add == 1  # one bundle fits the idle head, one needs a worker
    finally:
        os.killpg(pg_driver.pid, 9)
        pg_driver.wait()

    # 6. Stop the head from a fresh runtime (as after an agent restart): nothing of ours is left running.
    temp_dirs = [head.temp_dir, worker.temp_dir]
    restarted = RayProcessRuntime(RAY_BIN, tmp_path / "ray")
    assert head.pid in restarted.processes(head)
    restarted.stop(head)
    assert restarted.processes(head) == []
    ray_runtime.stop(head)  # the first runtime only reaps its child now
    assert ray_runtime.nodes() == []
    assert session_pids(head.pid) == []
    assert session_pids(worker.pid) == []
    assert our_processes(temp_dirs) == []


@pytest.mark.integration
def test_worker_that_cannot_join_fails_cleanly(tmp_path: Path):
    runtime = RayProcessRuntime(RAY_BIN, tmp_path / "ray")
    dead_head = f"127.0.0.1:{free_port()}"
    with pytest.raises(RayRuntimeError) as failure:
        runtime.start_worker(head_address=dead_head, num_cpus=1, dashboard_agent_listen_port=free_port(), timeout=5)
    assert "ray start" in str(failure.value) or "did not" in str(failure.value)
    assert runtime.nodes() == []
    assert our_processes([str(tmp_path)]) == []


def test_temp_dirs_leave_room_for_rays_socket_paths(tmp_path: Path):
    """The agent's default state dir gives /etc/cleverthis-agent/work/ray: Ray's sockets must still fit."""
    from agent.ray.process_runtime import MAX_UNIX_PATH, SOCKET_SUFFIX

    default = RayProcessRuntime(RAY_BIN, Path("/etc/cleverthis-agent/work/ray"))
    root = default._temp_root("ray-11111111-2222-4333-8444-555555555555")
    try:
        assert root.parent == Path("/tmp")
        assert root.name.startswith("ray-555555-")
        assert len(str(root)) + SOCKET_SUFFIX <= MAX_UNIX_PATH
    finally:
        root.rmdir()
    short = RayProcessRuntime(RAY_BIN, tmp_path.parent / "r")  # short enough: stays under work_dir
    if len(str(short.work_dir)) + 20 + SOCKET_SUFFIX <= MAX_UNIX_PATH:
        inside = short._temp_root("ray-abcdef")
        assert inside.parent == short.work_dir
        inside.rmdir()


def test_installed_version_is_the_ray_next_to_the_agent(tmp_path: Path):
    from importlib.metadata import version

    assert RayProcessRuntime(RAY_BIN, tmp_path).installed_version() == version("ray")


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_head_starts_with_a_work_dir_as_long_as_the_default_state_dirs(tmp_path: Path):
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="ctf-", dir="/tmp"))
    work_dir = base / ("w" * (len("/etc/cleverthis-agent/work/ray") - len(str(base)) - 5)) / "ray"
    assert len(str(work_dir)) == len("/etc/cleverthis-agent/work/ray")
    runtime = RayProcessRuntime(RAY_BIN, work_dir)
    try:
        head = runtime.start_head(gcs_port=free_port(), dashboard_port=free_port(), num_cpus=1, timeout=120)
        assert runtime.alive(head)
        sockets = list(Path(head.temp_dir).glob("session_*/sockets/*"))
        assert sockets
        assert all(len(str(s)) <= 107 for s in sockets)
    finally:
        runtime.stop_all()
        shutil.rmtree(base, ignore_errors=True)

"""Ray nodes the agent starts: worker port windows off the node's own ports, Ray's refusal of overlapping
ports as a port conflict, a head without a GCS port getting a free one, and a second stop joining the first.

The container engine and the ``ray`` program are stand-ins (no Docker, no Ray start needed): the engine
records specs and answers status like a head container; the fake ``ray`` checks its ports as Ray 2.9 does.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from agent import protocol
from agent.errors import CommandFailed
from agent.ray.commands import RayCommandHandler
from agent.ray.incontainer import MARKER
from agent.ray.members import member_name
from agent.ray.ports import free_port, worker_port_window
from agent.ray.process_runtime import RayProcessRuntime, RayRuntimeError
from raymgr.failures import failure_text

CLUSTER = "c0ffee00-0000-4000-8000-000000000001"
HEAD = "11111111-1111-4111-8111-111111111111"
REFUSAL = (
    "ValueError: Ray component worker_ports is trying to use a port number 15000 that is used by other "
    "components.\nPort information: ...\nIf you allocate ports, please make sure the same port is not used "
    "by multiple components."
)


def quiet(*_: Any, **__: Any) -> None:
    return None


def head_payload(**extra: Any) -> dict[str, Any]:
    return {
        "cluster_id": CLUSTER,
        "member_id": HEAD,
        "ray_version": "2.9.0",
        "image": "rayproject/ray:2.9.0",
        "runtime": "docker",
        **extra,
    }


class HeadEngine:
    """Stand-in engine: records runs and stops; `exec` answers a status listing the head's member."""

    def __init__(self, *, stop_gate: threading.Event | None = None, exited_with: str = "") -> None:
        self.runs: list[dict[str, Any]] = []
        self.stops: list[str] = []
        self.stop_gate = stop_gate
        self.exited_with = exited_with

    def run(self, spec: dict[str, Any]) -> str:
        self.runs.append(spec)
        return f"cid-{spec['name']}"

    def stop(self, name: str, *, timeout_s: int) -> bool:
        self.stops.append(name)
        if self.stop_gate is not None:
            assert self.stop_gate.wait(10)
        return True

    def state(self, name: str) -> dict[str, Any] | None:
        if not any(r["name"] == name for r in self.runs):
            return None
        if self.exited_with:
            return {"Running": False, "Status": "exited", "ExitCode": 1}
        return {"Running": True, "Status": "running"}

    def logs(self, name: str, *, lines: int) -> str:
        return self.exited_with or "Ray runtime started.\n"

    def exec(self, name: str, argv: list[str], *, timeout_s: float) -> tuple[int, str]:
        status = {"nodes": [{"node_id": "ab" * 28, "name": name, "is_head": True, "ip_address": "10.0.0.7"}]}
        return 0, MARKER + json.dumps(status)


def window_of(command: list[str]) -> tuple[int, int]:
    low = next(int(a.split("=", 1)[1]) for a in command if a.startswith("--min-worker-port="))
    high = next(int(a.split("=", 1)[1]) for a in command if a.startswith("--max-worker-port="))
    return low, high


PORT_FLAGS = (
    "--port=",
    "--dashboard-port=",
    "--ray-client-server-port=",
    "--dashboard-agent-listen-port=",
    "--dashboard-agent-grpc-port=",
    "--runtime-env-agent-port=",
    "--metrics-export-port=",
)


def own_ports(command: list[str]) -> set[int]:
    return {int(a.split("=", 1)[1]) for a in command if a.startswith(PORT_FLAGS)}


# --- finding 8: a node's worker port window never holds the node's own ports ------------------------------


def test_worker_port_window_avoids_the_ports_it_is_told_to():
    for _ in range(300):
        low, high = worker_port_window(avoid={11500, 15000, 18000})
        assert high - low == 999
        assert not any(low <= port <= high for port in (11500, 15000, 18000))
    # No gap of 1000 ports left: no window (Ray's defaults) rather than one that overlaps.
    assert worker_port_window(avoid=set(range(11000, 20000, 900))) is None


def test_docker_heads_worker_window_avoids_its_gcs_dashboard_and_agent_ports():
    handler = RayCommandHandler(containers=HeadEngine())
    p = protocol.parse_payload("ray.head.start", head_payload(gcs_port=15000, dashboard_port=12000))
    for _ in range(60):  # ~25 % of random windows held one of them before
        command = handler.docker.spec(p)["command"]
        low, high = window_of(command)
        ports = own_ports(command)
        assert {15000, 12000} <= ports
        assert not any(low <= port <= high for port in ports), (low, high, ports)


FAKE_RAY = """#!{python}
import re, sys
args = sys.argv[1:]
if args and args[0] == "--version":
    print("ray, version 2.60.0")
    sys.exit(0)
flags = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
window_flags = ("min-worker-port", "max-worker-port")
ports = {{k: int(v) for k, v in flags.items() if k.endswith("port") and k not in window_flags}}
low, high = int(flags.get("min-worker-port", 0)), int(flags.get("max-worker-port", -1))
always_refuse = {refuse}
clash = [p for p in ports.values() if low <= p <= high]
if clash or always_refuse:
    port = clash[0] if clash else 15000
    print("Traceback (most recent call last):")
    print(f"ValueError: Ray component worker_ports is trying to use a port number {{port}} that is used by other "
          "components.")
    print("Port information: ...")
    print("If you allocate ports, please make sure the same port is not used by multiple components.")
    sys.exit(1)
print("NO-OVERLAP")
sys.exit(3)
"""


def fake_ray(tmp_path: Path, *, refuse: bool) -> Path:
    path = tmp_path / "bin" / "ray"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(FAKE_RAY.format(python=sys.executable, refuse=refuse))
    path.chmod(0o755)
    return path


def test_process_heads_worker_window_avoids_its_own_ports(tmp_path: Path):
    runtime = RayProcessRuntime(fake_ray(tmp_path, refuse=False), tmp_path / "work")
    for _ in range(30):
        with pytest.raises(RayRuntimeError, match="exited with 3") as err:
            runtime.start_head(gcs_port=15000, dashboard_port=12000, num_cpus=1, timeout=10)
        assert "NO-OVERLAP" in str(err.value), str(err.value)[-400:]


def test_rays_refusal_of_its_ports_is_a_port_conflict_not_internal(tmp_path: Path):
    handler = RayCommandHandler(
        process_runtime=RayProcessRuntime(fake_ray(tmp_path, refuse=True), tmp_path / "work"), hostname="box"
    )
    payload = head_payload(runtime="process", ray_version="2.60.0", gcs_port=free_port(), dashboard_port=free_port())
    with pytest.raises(CommandFailed) as err:
        handler.run("ray.head.start", payload, quiet)
    assert err.value.code == "conflict"
    assert "port 15000" in err.value.message
    assert "worker" in err.value.message
    text = failure_text(err.value.code, err.value.message)
    assert text.startswith("Port conflict:")
    assert "Drain the node" not in text

    docker = RayCommandHandler(containers=HeadEngine(exited_with=REFUSAL), hostname="box")
    with pytest.raises(CommandFailed) as err:
        docker.run("ray.head.start", head_payload(gcs_port=free_port(), dashboard_port=free_port()), quiet)
    assert err.value.code == "conflict"
    assert "port 15000" in err.value.message


# --- finding 11: a head started without a GCS port gets a free one (never Redis's 6379) -------------------


def test_a_head_without_a_gcs_port_gets_a_free_one_not_redis(tmp_path: Path):
    assert protocol.RayHeadStartPayload.__dataclass_fields__["gcs_port"].default != 6379
    holder = None
    if not _in_use(6379):  # the machine the README sets up runs Redis on 6379: be that machine
        holder = socket.socket()
        holder.bind(("0.0.0.0", 6379))
        holder.listen()
    try:
        engine = HeadEngine()
        handler = RayCommandHandler(containers=engine, hostname="box", state_path=None, work_dir=tmp_path)
        result = handler.run("ray.head.start", head_payload(dashboard_port=free_port()), quiet)
    finally:
        if holder is not None:
            holder.close()
    (spec,) = engine.runs
    port = result.gcs_port
    assert port != 6379
    assert f"--port={port}" in spec["command"]
    assert result.gcs_address == f"10.0.0.7:{port}"
    low, high = window_of(spec["command"])
    assert not low <= port <= high


def _in_use(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False


# --- finding 9: a stop of a member already stopping joins that stop ---------------------------------------


def test_a_second_stop_of_a_member_already_stopping_joins_the_first():
    gate = threading.Event()
    engine = HeadEngine(stop_gate=gate)
    handler = RayCommandHandler(containers=engine)
    stop = {"cluster_id": CLUSTER, "member_id": HEAD, "runtime": "docker", "container": "c"}
    results: list[protocol.RayNodeStopResult] = []
    first = threading.Thread(target=lambda: results.append(handler.run("ray.node.stop", stop, quiet)))
    first.start()
    try:
        for _ in range(200):
            if engine.stops:
                break
            threading.Event().wait(0.01)
        second = threading.Thread(target=lambda: results.append(handler.run("ray.node.stop", stop, quiet)))
        second.start()
        second.join(0.3)
        assert second.is_alive()  # it waits for the stop in flight…
    finally:
        gate.set()
    first.join(5)
    second.join(5)
    assert engine.stops == [member_name(HEAD)]  # …and never stops the container a second time
    assert len(results) == 2
    assert all(r.stopped for r in results)
    # Once that stop is over, a new stop is a stop again.
    handler.run("ray.node.stop", stop, quiet)
    assert engine.stops == [member_name(HEAD)] * 2

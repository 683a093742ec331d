"""The agent's `ray.*` commands: docker specs, errors, and the process runtime against real Ray.

The docker runtime cannot run here (no Docker engine, no rayproject images): its container engine is
replaced by `HostEngine`, a stand-in that records container specs and runs `exec` argv on this machine —
so the status/drain program meant for the head container runs for real against a real Ray head.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent import protocol
from agent.errors import CommandFailed
from agent.ray.commands import RayCommandHandler
from agent.ray.gcs import NODE_LABEL
from agent.ray.members import log_text, member_name, member_of, normalize_status, tail_lines
from agent.ray.ports import free_port, port_in_use
from agent.ray.process_runtime import RayProcessRuntime, session_pids
from tests.support.processes import VENV_BIN, wait_until

RAY_BIN = VENV_BIN / "ray"
CLUSTER = "c0ffee00-0000-4000-8000-000000000001"
HEAD = "11111111-1111-4111-8111-111111111111"
WORKER = "22222222-2222-4222-8222-222222222222"


def steps() -> tuple[list[str], Any]:
    seen: list[str] = []
    return seen, lambda message, percent=None, data=None: seen.append(message)


class HostEngine:
    """Stand-in for the Docker engine: records runs/stops; `exec` runs argv here with RAY_ADDRESS set."""

    def __init__(self, ray_address: str = "") -> None:
        self.runs: list[dict[str, Any]] = []
        self.stops: list[str] = []
        self.ray_address = ray_address

    def run(self, spec: dict[str, Any]) -> str:
        self.runs.append(spec)
        return f"cid-{spec['name']}"

    def stop(self, name: str, *, timeout_s: int) -> bool:
        self.stops.append(name)
        return True

    def state(self, name: str) -> dict[str, Any] | None:
        return {"Running": True, "Status": "running"} if any(r["name"] == name for r in self.runs) else None

    def logs(self, name: str, *, lines: int) -> str:
        return "Ray runtime started.\n"

    def exec(self, name: str, argv: list[str], *, timeout_s: float) -> tuple[int, str]:
        argv = [str(VENV_BIN / "python"), *argv[1:]] if argv[0] == "python" else argv
        env = {**os.environ, "RAY_ADDRESS": self.ray_address, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env)
        return done.returncode, done.stdout + done.stderr


def head_payload(**extra: Any) -> dict[str, Any]:
    return {
        "cluster_id": CLUSTER,
        "member_id": HEAD,
        "ray_version": "2.60.0",
        "image": "rayproject/ray:2.60.0",
        "runtime": "docker",
        "gcs_port": free_port(),
        "dashboard_port": free_port(),
        **extra,
    }


def test_handles_only_ray_commands():
    handler = RayCommandHandler()
    assert handler.handles("ray.head.start")
    assert handler.handles("ray.status")
    assert not handler.handles("container.create")
    with pytest.raises(CommandFailed) as err:
        handler.run("container.create", {}, lambda *a, **k: None)
    assert err.value.code == "unknown_command"


def test_invalid_payloads_and_missing_runtimes_fail_with_codes():
    handler = RayCommandHandler()
    _, progress = steps()
    with pytest.raises(CommandFailed) as err:
        handler.run("ray.head.start", {"cluster_id": CLUSTER}, progress)
    assert err.value.code == "invalid_payload"
    with pytest.raises(CommandFailed) as err:
        handler.run("ray.head.start", head_payload(), progress)
    assert err.value.code == "docker_unavailable"
    with pytest.raises(CommandFailed) as err:
        handler.run("ray.head.start", head_payload(runtime="process"), progress)
    assert err.value.code == "unsupported"


def test_docker_head_spec_names_the_member_and_uses_the_payload_image():
    engine = HostEngine()
    handler = RayCommandHandler(containers=engine)
    from agent import protocol

    p = protocol.parse_payload("ray.head.start", head_payload(gcs_port=6390, dashboard_port=8270))
    spec = handler.docker.spec(p)
    assert spec["name"] == f"ray-{HEAD}"
    assert spec["image"] == "rayproject/ray:2.60.0"
    assert spec["network_mode"] == "host"
    assert "--port=6390" in spec["command"]
    assert "--dashboard-port=8270" in spec["command"]
    assert f"--labels={NODE_LABEL}=ray-{HEAD}" in spec["command"]
    assert spec["labels"]["cleverthis.ray.member"] == HEAD
    assert "device_requests" not in spec
    assert not any(a.startswith("--runtime-env-agent-port") for a in spec["command"])  # Ray 2.60 binds its own


def test_docker_spec_pins_ray_29s_agent_ports_to_distinct_free_ports():
    handler = RayCommandHandler(containers=HostEngine())
    from agent import protocol

    payload = head_payload(gcs_port=6390, dashboard_port=8270, ray_version="2.9.0", image="rayproject/ray:2.9.0")
    spec = handler.docker.spec(protocol.parse_payload("ray.head.start", payload))
    flags = ("--dashboard-agent-grpc-port=", "--runtime-env-agent-port=", "--metrics-export-port=")
    ports = [int(a.split("=", 1)[1]) for a in spec["command"] if a.startswith(flags)]
    assert len(ports) == 3
    listen = [int(a.split("=", 1)[1]) for a in spec["command"] if a.startswith("--dashboard-agent-listen-port=")]
    assert len(set(ports + listen)) == 4
    low = next(int(a.split("=", 1)[1]) for a in spec["command"] if a.startswith("--min-worker-port="))
    high = next(int(a.split("=", 1)[1]) for a in spec["command"] if a.startswith("--max-worker-port="))
    assert high - low == 999
    assert not any(low <= port <= high for port in ports + listen)


def test_docker_specs_advertise_the_configured_node_ip(tmp_path, monkeypatch):
    from agent import protocol
    from agent.ray.commands import default_handler

    def node_ips(handler: RayCommandHandler) -> list[list[str]]:
        head = handler.docker.spec(protocol.parse_payload("ray.head.start", head_payload()))
        worker = handler.docker.spec(
            protocol.parse_payload(
                "ray.worker.start",
                {
                    **{k: v for k, v in head_payload().items() if not k.endswith("_port")},
                    "member_id": WORKER,
                    "head_address": "10.213.0.1:6390",
                },
            )
        )
        return [[a for a in spec["command"] if a.startswith("--node-ip-address")] for spec in (head, worker)]

    # Unset: Ray picks the address of the default route's interface (no flag).
    monkeypatch.delenv("CLEVERTHIS_RAY_NODE_IP", raising=False)
    assert node_ips(default_handler(tmp_path / "a")) == [[], []]
    # Set: every Ray container of this node advertises it (a cluster network other than the default route).
    monkeypatch.setenv("CLEVERTHIS_RAY_NODE_IP", "10.213.0.2")
    handler = default_handler(tmp_path / "b")
    assert node_ips(handler) == [["--node-ip-address=10.213.0.2"]] * 2
    if handler.process_runtime is not None:
        assert handler.process_runtime.node_ip_address == "10.213.0.2"


def test_docker_gpu_worker_spec_and_start_result():
    engine = HostEngine()
    handler = RayCommandHandler(containers=engine, hostname="gpu-box")
    seen, progress = steps()
    payload = {
        "cluster_id": CLUSTER,
        "member_id": WORKER,
        "ray_version": "2.60.0",
        "image": "rayproject/ray:2.60.0-gpu",
        "runtime": "docker",
        "head_address": "10.0.0.1:6390",
        "num_gpus": 2,
    }
    result = handler.run("ray.worker.start", payload, progress)
    (spec,) = engine.runs
    assert spec["image"] == "rayproject/ray:2.60.0-gpu"
    assert spec["device_requests"][0]["driver"] == "nvidia"
    assert "--address=10.0.0.1:6390" in spec["command"]
    assert "--num-gpus=2" in spec["command"]
    assert result == protocol.RayNodeStartResult(container_id=f"cid-ray-{WORKER}", hostname="gpu-box")
    assert "joining 10.0.0.1:6390" in seen[0]
    stop = {"cluster_id": CLUSTER, "member_id": WORKER, "runtime": "docker", "container": "x"}
    assert handler.run("ray.node.stop", stop, progress) == protocol.RayNodeStopResult(stopped=True)
    assert engine.stops == [f"ray-{WORKER}"]


def test_head_start_refuses_a_port_in_use():
    engine = HostEngine()
    handler = RayCommandHandler(containers=engine)
    import socket

    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert port_in_use(port)
        with pytest.raises(CommandFailed) as err:
            handler.run("ray.head.start", head_payload(gcs_port=port), lambda *a, **k: None)
    assert err.value.code == "conflict"
    assert f"port {port} is already in use" in err.value.message
    assert engine.runs == []


def test_normalize_status_maps_labels_back_to_members():
    raw = {
        "demand": {"bundles": [{"CPU": 1.0}], "placement_groups": [], "truncated": False},
        "head_free": {"CPU": 0.0},
        "nodes": [
            {
                "node_id": "ab",
                "name": member_name(HEAD),
                "is_head": True,
                "status": "RUNNING",
                "idle_s": 0.0,
                "resources": {"CPU": 1.0},
                "available": {"CPU": 0.0},
                "ip_address": "10.0.0.1",
            },
            {
                "node_id": "cd",
                "name": None,
                "is_head": False,
                "status": "IDLE",
                "idle_s": 12.5,
                "resources": {"CPU": 2.0},
                "available": {"CPU": 2.0},
                "ip_address": "10.0.0.2",
            },
        ],
    }
    status = normalize_status(raw)
    assert status.pending == [{"CPU": 1.0}]
    assert [(n.member_id, n.ray_node_id, n.ip) for n in status.nodes] == [
        (HEAD, "ab", "10.0.0.1"),
        ("", "cd", "10.0.0.2"),
    ]
    assert member_of("someone-else") == ""


# --- real Ray: the process runtime, and the docker runtime's in-container program ----------------


@pytest.fixture
def handler(tmp_path: Path) -> Iterator[RayCommandHandler]:
    runtime = RayProcessRuntime(RAY_BIN, tmp_path / "ray")
    yield RayCommandHandler(process_runtime=runtime, default_num_cpus=1, hostname="test-host")
    runtime.stop_all()


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_process_runtime_head_worker_status_drain_stop(handler: RayCommandHandler, tmp_path: Path):
    seen, progress = steps()
    gcs, dash = free_port(), free_port()
    head_start = {**head_payload(runtime="process"), "gcs_port": gcs, "dashboard_port": dash}
    head = handler.run("ray.head.start", head_start, progress)
    assert head.ray_node_id
    assert head.gcs_address.endswith(f":{gcs}")
    assert head.hostname == "test-host"
    assert head.ip == head.gcs_address.rsplit(":", 1)[0]
    # Idempotent: the same start answers the running head.
    again = handler.run("ray.head.start", head_start, progress)
    assert again.already_running is True
    assert again.ray_node_id == head.ray_node_id

    worker_start = {
        "cluster_id": CLUSTER,
        "member_id": WORKER,
        "ray_version": "2.60.0",
        "image": "rayproject/ray:2.60.0",
        "runtime": "process",
        "head_address": head.gcs_address,
        "num_cpus": 1,
    }
    worker = handler.run("ray.worker.start", worker_start, progress)
    assert worker.ray_node_id not in ("", head.ray_node_id)

    status_payload = {
        "cluster_id": CLUSTER,
        "member_id": HEAD,
        "runtime": "process",
        "gcs_port": gcs,
        "include_logs": True,
        "log_lines": 20,
    }
    status = handler.run("ray.status", status_payload, progress)
    members = {n.member_id: n for n in status.nodes}
    assert set(members) == {HEAD, WORKER}
    assert members[HEAD].is_head is True
    assert members[WORKER].ray_node_id == worker.ray_node_id
    assert members[WORKER].resources["CPU"] == 1.0
    assert status.pending == []
    assert "gcs" in status.logs
    assert status.logs["gcs"]  # the head's GCS log has lines

    # The docker runtime's in-container program, run here against the same real head.
    engine = HostEngine(ray_address=head.gcs_address)
    docker_handler = RayCommandHandler(containers=engine)
    docker_status = docker_handler.run(
        "ray.status", {**status_payload, "runtime": "docker", "include_logs": False}, progress
    )
    assert {n.member_id for n in docker_status.nodes} == {HEAD, WORKER}

    # A drain of the worker once it idles is accepted (through the docker program: same GCS RPC).
    wait_until(
        lambda: any(
            n.member_id == WORKER and n.idle_s > 0
            for n in handler.run("ray.status", {**status_payload, "include_logs": False}, progress).nodes
        ),
        timeout=60,
        interval=0.5,
        what="the worker to be idle",
    )
    drain = {
        "cluster_id": CLUSTER,
        "member_id": WORKER,
        "ray_node_id": worker.ray_node_id,
        "runtime": "process",
        "head_member_id": HEAD,
        "gcs_port": gcs,
        "reason": "autoscaler: idle",
    }
    assert handler.run("ray.node.drain", drain, progress) == protocol.RayNodeDrainResult(accepted=True)
    stop = {"cluster_id": CLUSTER, "member_id": WORKER, "runtime": "process"}
    assert handler.run("ray.node.stop", stop, progress) == protocol.RayNodeStopResult(stopped=True)
    assert handler.run("ray.node.stop", stop, progress).stopped is False  # idempotent

    # A fresh handler (agent restart) still finds and stops the head from its state file.
    restarted = RayCommandHandler(process_runtime=RayProcessRuntime(RAY_BIN, tmp_path / "ray"))
    head_pid = restarted.process.member(HEAD).pid
    assert restarted.run(
        "ray.node.stop", {"cluster_id": CLUSTER, "member_id": HEAD, "runtime": "process"}, progress
    ) == protocol.RayNodeStopResult(stopped=True)
    assert session_pids(head_pid) == []
    with pytest.raises(CommandFailed) as err:
        restarted.run("ray.status", status_payload, progress)
    assert err.value.code == "not_found"
    assert any("starting Ray 2.60.0 head" in s for s in seen)


def test_log_tails_drop_control_characters_the_control_plane_cannot_store():
    # a Ray log read while it is written held NULs (gcs_server.out in a Ray 2.60 container): PostgreSQL refused them
    torn = "Execution ti\x01\x00\x00\x00\nsme: mean = 0.61ms\tok\r\n"
    assert log_text(torn) == "Execution ti\nsme: mean = 0.61ms\tok\r\n"
    assert tail_lines("one\ntw\x00o\nthree", 2) == "two\nthree"


class EndedEngine(HostEngine):
    """A Ray container that ended by itself (`ray start --block` saw one of Ray's processes die)."""

    def state(self, name: str) -> dict[str, Any] | None:
        return {"Running": False, "Status": "exited", "ExitCode": 1, "OOMKilled": False}

    def logs(self, name: str, *, lines: int) -> str:
        return "Ray runtime started.\nSome Ray subprocesses exited unexpectedly:\n  raylet [exit code=1]\n"


def test_stopping_a_container_that_had_ended_says_how_it_ended_before_removing_it():
    engine = EndedEngine()
    handler = RayCommandHandler(containers=engine)
    seen, progress = steps()
    stop = {"cluster_id": CLUSTER, "member_id": HEAD, "runtime": "docker"}
    assert handler.run("ray.node.stop", stop, progress).stopped
    assert engine.stops == [member_name(HEAD)]
    ended = next(m for m in seen if "had ended" in m)
    assert "exit code 1" in ended
    assert "raylet [exit code=1]" in ended

"""The docker runtime on a real engine: Podman's Docker API and the Ray image `.ci/ray-image` builds.

Two `RayCommandHandler`s stand for the agents of two hosts. Both run their containers on the host network
(as production does, Ray's guidance for multi-node clusters); on this one machine the two "hosts" share
that network namespace, so each Ray node gets ports of its own (the runtime picks the per-node ports free)
and the worker joins the head at the head's advertised node IP, never loopback. Status and drain run inside
the head container with the image's Ray (2.9.0), not the agent's.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent import protocol
from agent.errors import CommandFailed
from agent.ray.commands import RayCommandHandler
from agent.ray.containers import DockerRayContainers
from tests.agent.executors.podman import registry_address
from tests.support import ray_docker
from tests.support.ray_docker import containers_of, engine_with, ray_hosts, remove_members, worker_payload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

VERSION = "2.9.0"
IMAGE = f"rayproject/ray:{VERSION}"
CLUSTER = "c0ffee00-0000-4000-8000-0000000000d0"
HEAD = "d0000000-0000-4000-8000-000000000001"
WORKER = "d0000000-0000-4000-8000-000000000002"
# Memory is shared with other test runs on this machine: small caps, object store in a sized /dev/shm.
MEMORY, SHM = "2g", "512m"


def quiet(*_: Any, **__: Any) -> None:
    return None


@pytest.fixture(scope="module")
def engine_url() -> str:
    return engine_with(f"docker.io/{IMAGE}", ".ci/ray-image")


@pytest.fixture
def handlers(engine_url: str, tmp_path) -> Iterator[list[RayCommandHandler]]:
    yield ray_hosts(engine_url, tmp_path, memory=MEMORY, shm=SHM)
    remove_members([HEAD, WORKER, "oom", "busy", "nopull"])


def head_payload(member: str = HEAD, **extra: Any) -> dict[str, Any]:
    return {**ray_docker.head_payload(CLUSTER, member, VERSION, IMAGE), **extra}


def containers_left() -> list[str]:
    return containers_of(CLUSTER)


def test_head_and_worker_containers_join_report_drain_and_leave_nothing(handlers):
    first, second = handlers
    payload = head_payload()
    started = time.monotonic()
    head = first.run("ray.head.start", payload, quiet)
    head_s = time.monotonic() - started
    assert head.ray_node_id
    assert head.ip
    assert not head.ip.startswith("127.")
    assert payload["dashboard_port"] in first.dashboard_ports()  # the tunnel may reach this dashboard

    started = time.monotonic()
    second.run("ray.worker.start", worker_payload(payload, WORKER, head.gcs_address), quiet)
    status_payload = {"cluster_id": CLUSTER, "member_id": HEAD, "runtime": "docker", "gcs_port": payload["gcs_port"]}
    status: dict[str, Any] = {}
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        status = first.run("ray.status", {**status_payload, "include_logs": True, "log_lines": 5}, quiet)
        if {n.member_id for n in status.nodes} == {HEAD, WORKER}:
            break
        time.sleep(2)
    join_s = time.monotonic() - started
    members = {n.member_id: n for n in status.nodes}
    assert set(members) == {HEAD, WORKER}, status
    assert members[WORKER].resources["CPU"] == 1.0
    assert status.logs["gcs"]
    print(f"\nhead container up in {head_s:.1f} s; worker joined in {join_s:.1f} s")

    # The idle worker is drained through the head container (its own Ray 2.9.0), then removed.
    drain = {
        "cluster_id": CLUSTER,
        "member_id": WORKER,
        "ray_node_id": members[WORKER].ray_node_id,
        "runtime": "docker",
        "head_member_id": HEAD,
        "gcs_port": payload["gcs_port"],
        "reason": "autoscaler: idle",
    }
    assert first.run("ray.node.drain", drain, quiet) == protocol.RayNodeDrainResult(accepted=True)
    stop = {"cluster_id": CLUSTER, "runtime": "docker", "timeout_s": 10}
    assert second.run("ray.node.stop", {**stop, "member_id": WORKER}, quiet) == protocol.RayNodeStopResult(stopped=True)
    assert first.run("ray.node.stop", {**stop, "member_id": HEAD}, quiet) == protocol.RayNodeStopResult(stopped=True)
    assert first.run("ray.node.stop", {**stop, "member_id": HEAD}, quiet) == protocol.RayNodeStopResult(stopped=False)
    assert containers_left() == []
    assert payload["dashboard_port"] not in first.dashboard_ports()


def test_image_pull_failure(handlers):
    missing = f"{registry_address()}/nobody/ray:{VERSION}"  # nothing listens there
    with pytest.raises(CommandFailed) as err:
        handlers[0].run("ray.head.start", head_payload("nopull", image=missing), quiet)
    assert err.value.code == "image_pull_failed"
    assert missing in err.value.message
    assert "Traceback" not in err.value.message
    assert containers_left() == []


def test_engine_down(tmp_path):
    handler = RayCommandHandler(containers=DockerRayContainers(base_url=f"unix://{tmp_path}/no-engine.sock"))
    with pytest.raises(CommandFailed) as err:
        handler.run("ray.head.start", head_payload("busy"), quiet)
    assert err.value.code == "docker_unavailable"
    assert "not answering" in err.value.message


def test_port_conflict(handlers):
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(CommandFailed) as err:
            handlers[0].run("ray.head.start", head_payload("busy", dashboard_port=port), quiet)
    assert err.value.code == "conflict"
    assert f"port {port} is already in use" in err.value.message
    assert containers_left() == []


def test_out_of_memory(engine_url, tmp_path):
    handler = RayCommandHandler(
        containers=DockerRayContainers(base_url=engine_url),
        work_dir=tmp_path,
        container_memory="120m",  # far below what a Ray head needs
        container_shm_size="64m",
        register_timeout_s=240,
    )
    with pytest.raises(CommandFailed) as err:
        handler.run("ray.head.start", head_payload("oom"), quiet)
    assert err.value.code == "insufficient_memory", err.value.message
    assert containers_left() == []


def test_more_memory_than_the_machine_has_is_refused_before_starting(engine_url, tmp_path):
    handler = RayCommandHandler(
        containers=DockerRayContainers(base_url=engine_url), work_dir=tmp_path, container_memory="64t"
    )
    with pytest.raises(CommandFailed) as err:
        handler.run("ray.head.start", head_payload("oom"), quiet)
    assert err.value.code == "insufficient_memory"
    assert "needs" in err.value.message
    assert containers_left() == []

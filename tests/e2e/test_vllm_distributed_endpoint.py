"""A distributed endpoint end to end: real agents, a real managed Ray cluster, real vLLM (the CPU build).

Two local nodes, each its own agent → a managed Ray cluster of a head and a worker (the `process` runtime) →
the tiny Llama downloaded to both → an endpoint on the Ray cluster, pipeline parallel 2: the leader on the
head's node serves the API, the follower on the worker's node runs headless (vLLM's own multi-node executor
over gloo: vLLM's CPU build refuses its Ray executor) → a completion through the endpoint's URL → the
follower's rank killed → its agent drops it, the endpoint fails with that reason on its log and the leader is
stopped → the healing pass starts the whole group again (the Ray cluster is whole) → a completion again →
stop ends every rank. The healing pass is the beat task's function, called here on a short loop.

Needs `.ci/vllm-venv` (skips without it, fails under CI=true). Slow: a pipeline-parallel rank on CPU starts
compiled (minutes on two busy cores), and the group starts twice.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from rest_framework.authtoken.models import Token

from agent.ray.ports import free_port
from fleet import services
from fleet.models import Command, Node
from fleet.workloads import services as workload_services
from fleet.workloads.models import EndpointReplica
from fleet.workloads.tasks import endpoints_heal_tick
from raymgr import services as ray_services
from raymgr.models import RayCluster, RayNode
from tests.e2e.conftest import node_of
from tests.support.endpoint_calls import complete, status_of
from tests.support.processes import REPO_ROOT, wait_until
from tests.support.tiny_llm import build, require_vllm_python

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True), pytest.mark.timeout(2400)]

MODEL = "acme/tiny-llama"


@pytest.fixture(scope="module")
def engine_python() -> str:
    return require_vllm_python()


def healing_until(done, *, timeout: float, what: str) -> None:
    """Run the beat's healing pass every 2 s until `done()`."""

    def step() -> bool:
        endpoints_heal_tick()
        return done()

    wait_until(step, timeout=timeout, interval=2, what=what)


def rank_pid(state: Path, server_id: str) -> int:
    records = json.loads((state / "work" / "endpoints" / "endpoints.json").read_text())
    return records[server_id]["pid"]


def test_pipeline_parallel_2_on_a_ray_cluster_fails_and_heals_as_one(
    control_plane, cluster, operator, agents, hub, engine_python, tmp_path, no_leftover_ray
):
    user, workspace = operator
    hub.add_repo(MODEL, build(tmp_path / "tiny-llama", engine_python))
    env = {
        "CLEVERTHIS_VLLM_CPU_PYTHON": engine_python,
        "CLEVERTHIS_VLLM_DEVICE": "cpu",
        "CLEVERTHIS_VLLM_MAX_MODEL_LEN": "256",
        "PYTHONPATH": str(REPO_ROOT),
    }
    states = {}
    for name in ("rank-a", "rank-b"):
        _, state, _ = agents(control_plane, cluster, user, name, extra_env=env)
        states[node_of(state).pk] = state
    wait_until(lambda: Node.objects.filter(cluster=cluster, status="online").count() == 2, timeout=60, what="online")
    for node in Node.objects.filter(cluster=cluster):
        (download,) = services.command_dispatch(
            actor=user, cluster=cluster, command_type="model.download", payload={"model_id": MODEL}, node=node
        )
        wait_until(lambda d=download: Command.objects.get(pk=d.pk).status == "succeeded", timeout=120, what="download")

    ray = ray_services.ray_cluster_create(
        actor=user,
        workspace=workspace,
        compute_cluster=cluster,
        name="pp",
        runtime="process",
        min_workers=1,
        max_workers=1,
        gcs_port=free_port(),
        dashboard_port=free_port(),
    )
    wait_until(
        lambda: RayNode.objects.filter(ray_cluster=ray, status="running").count() == 2,
        timeout=300,
        interval=1,
        what="the Ray head and worker running",
    )
    ray = RayCluster.objects.get(pk=ray.pk)
    assert ray.status == "running", ray.failure_reason

    asked = time.monotonic()
    endpoint = workload_services.endpoint_create(
        actor=user, cluster=cluster, model_id=MODEL, ray_cluster=ray, pipeline_parallel=2
    )
    leader, follower = EndpointReplica.objects.filter(endpoint=endpoint).order_by("group_rank")
    head = RayNode.objects.get(ray_cluster=ray, role="head")
    assert leader.node_id == head.node_id
    healing_until(lambda: status_of(endpoint) in ("running", "failed"), timeout=1200, what="the group running")
    endpoint.refresh_from_db()
    assert endpoint.status == "running", endpoint.failure_message
    print(f"distributed endpoint: {time.monotonic() - asked:.0f} s from endpoint_create to running")
    for replica in EndpointReplica.objects.filter(endpoint=endpoint).order_by("group_rank"):
        phases = (Command.objects.get(pk=replica.start_command_id).result or {}).get("phases")
        print(f"  rank {replica.group_rank} ({replica.group_role}) start phases: {phases}")

    token = Token.objects.create(user=user)
    headers = {"Authorization": f"Token {token.key}", "Host": endpoint.hostname}
    first = complete(control_plane.url, headers, MODEL)
    assert first["usage"]["completion_tokens"] == 8
    began = time.monotonic()
    tokens = sum(complete(control_plane.url, headers, MODEL)["usage"]["completion_tokens"] for _ in range(3))
    print(f"distributed endpoint through the proxy: {tokens / (time.monotonic() - began):.1f} tokens/s (1 stream)")

    # the follower's rank dies: the group fails with the reason and its leader is stopped
    follower = EndpointReplica.objects.get(pk=follower.pk)
    os.killpg(rank_pid(states[follower.node_id], follower.server_id), signal.SIGKILL)
    failed = endpoint.events.filter(kind="endpoint.group_failed")
    healing_until(failed.exists, timeout=300, what="the group failed")
    reason = failed.get().data["reason"]
    assert failed.get().data["code"] == "group_member_lost"
    # what the control plane saw first: the follower gone from its agent, or the leader's probe failing (a
    # pipeline missing its last stage answers nothing)
    assert f"rank 1 (follower) on node {follower.node.name}" in reason or (
        "rank 0 (leader)" in reason and "unresponsive" in reason
    ), reason

    # the Ray cluster is whole: the healing pass starts every rank again
    healing_until(lambda: status_of(endpoint) == "running", timeout=1200, what="the group running again")
    assert endpoint.events.filter(kind="endpoint.group_restarted").exists()
    again = complete(control_plane.url, headers, MODEL)
    assert again["choices"][0]["text"] == first["choices"][0]["text"]  # greedy: the same model answers alike

    workload_services.endpoint_stop(actor=user, endpoint=endpoint)
    wait_until(lambda: status_of(endpoint) == "stopped", timeout=120, what="stopped")
    for replica in EndpointReplica.objects.filter(endpoint=endpoint):
        records = json.loads((states[replica.node_id] / "work" / "endpoints" / "endpoints.json").read_text())
        pid = records.get(replica.server_id, {}).get("pid")
        assert pid is None or not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE

"""Issue #49's acceptance test through the control plane: a distributed endpoint whose ranks run inside the
containers of a managed Ray cluster (docker runtime on real Podman, Ray 2.60.0, real vLLM's CPU build).

Two real agents (two nodes of one standalone cluster) → a docker-runtime Ray cluster that serves vLLM
(`serves_vllm`: its head and worker containers run `cleverthis/ray-vllm:2.60.0-vllm0.32.0`, which
`.ci/ray-vllm-image` builds) → the tiny Llama downloaded to both → an endpoint on it, pipeline parallel 2: the
leader inside the head's container serves the API, the follower runs headless inside the worker's → a
completion through the endpoint's URL (web process → tunnel → agent → leader) → the worker container killed →
the group fails with the reason (the leader's probe, or Ray no longer listing the worker), the killed
worker's container is removed from its node, the Ray autoscaler starts another worker and the healing pass
starts the group again on it → the same completion again → stop ends every rank → the Ray cluster deleted
leaves no container behind.

The beat's passes (endpoint healing, the Ray autoscaler, the resend of unacknowledged commands) are called
here on a short loop. Heavy (two compiled CPU vLLM starts; minutes on two busy cores): run it under
``flock /work/bench.lock``. Skips without Podman, the image or vLLM's CPU build (fails under CI=true).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from rest_framework.authtoken.models import Token

from agent.ray.members import member_name
from agent.ray.ports import free_port
from fleet import services
from fleet.models import Command, Node
from fleet.services.command_delivery import commands_resend_stuck
from fleet.workloads import services as workload_services
from fleet.workloads.models import EndpointReplica
from fleet.workloads.tasks import endpoints_heal_tick
from raymgr import services as ray_services
from raymgr.models import RayCluster, RayNode
from raymgr.tasks import autoscale
from tests.agent.executors.podman import require_podman
from tests.support.endpoint_calls import complete, status_of
from tests.support.environment import missing
from tests.support.node_container import podman
from tests.support.processes import wait_until
from tests.support.ray_docker import containers_of, ray_errors, remove_containers
from tests.support.tiny_llm import build, require_vllm_python

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True), pytest.mark.timeout(2700)]

MODEL = "acme/tiny-llama"
VERSION = "2.60.0"
# Each container holds a Ray node and one compiled float32 vLLM rank with a 1 GiB KV cache.
RAY_ENV = {"CLEVERTHIS_RAY_MEMORY": "5g", "CLEVERTHIS_RAY_SHM_SIZE": "1g"}
VLLM_ENV = {"CLEVERTHIS_VLLM_DEVICE": "cpu", "CLEVERTHIS_VLLM_MAX_MODEL_LEN": "256", "VLLM_CPU_KVCACHE_SPACE": "1"}
GROUP_START_S = 900  # a compiled CPU rank under load: minutes


def vllm_image() -> str:
    template = django_settings.RAY_VLLM_IMAGE_TEMPLATE
    return template.format(version=VERSION, vllm=django_settings.RAY_VLLM_VERSIONS[VERSION])


@pytest.fixture
def ray_vllm_env(settings):
    """(agent env for Ray containers carrying vLLM, list to append Ray cluster ids to): those go at teardown."""
    url = require_podman()
    if podman("image", "exists", vllm_image(), check=False).returncode != 0:
        missing(f"no {vllm_image()} image", "run .ci/ray-vllm-image (as root) to build it")
    python = require_vllm_python(" (it makes the tiny model)")
    settings.COMMAND_RESEND_AFTER_S = 20  # the resend below runs in this process, with these settings
    made: list[str] = []
    yield {"DOCKER_HOST": url, **RAY_ENV, **VLLM_ENV}, made, python
    remove_containers(made)


def beat_until(done, *, timeout: float, what: str, explain=None) -> None:  # type: ignore[no-untyped-def]
    """Run the beat's passes until `done()`: endpoint healing every 2 s, the Ray autoscaler at the beat's
    cadence (its `ray.status` notices a dead worker, and it starts another) and the resend of commands their
    agent never acknowledged; on a timeout print `explain()`."""
    autoscaled = 0.0

    def step() -> bool:
        nonlocal autoscaled
        endpoints_heal_tick()
        if time.monotonic() - autoscaled >= django_settings.CELERY_BEAT_SCHEDULE["raymgr-autoscale"]["schedule"]:
            autoscale()
            autoscaled = time.monotonic()
        commands_resend_stuck()
        return done()

    try:
        wait_until(step, timeout=timeout, interval=2, what=what)
    except TimeoutError:
        if explain is not None:
            print(explain())
        raise


def evidence(cluster_id: str, log_dir: Path) -> str:
    """Why the cluster's containers are as they are: their state, last output and Ray's error lines; how the
    agents found the containers they removed that had ended; the kernel's OOM kills."""
    parts = []
    for name in containers_of(cluster_id):
        state = podman("inspect", "--format", "{{json .State}}", name, check=False).stdout.strip()
        logs = podman("logs", "--tail", "20", name, check=False)
        kills = podman(
            "exec",
            name,
            "sh",
            "-c",
            "grep -i -h kill /tmp/ray/session_latest/logs/*.out /tmp/ray/session_latest/logs/"
            "*.log 2>/dev/null | tail -n 15; ps -eo pid,ppid,stat,args | cut -c1-160",
            check=False,
        ).stdout
        parts.append(f"--- {name}: {state}\n{(logs.stdout + logs.stderr)[-3000:]}\n{ray_errors(name)}\n{kills[-4000:]}")
    for log in sorted(log_dir.glob("agent-*.log")):
        ended = [line for line in log.read_text(errors="replace").splitlines() if "had ended" in line]
        parts.append(f"--- {log.name}: containers removed after they ended:\n" + "\n".join(ended[-5:]))
    dmesg = subprocess.run(["dmesg"], capture_output=True, text=True, check=False).stdout.splitlines()
    parts.append("--- dmesg (OOM kills):\n" + "\n".join(x for x in dmesg[-300:] if "out of memory" in x.lower()))
    return "\n".join(parts)


def vllm_processes(container: str) -> list[str]:
    """The vLLM processes (zombies aside) in `container`; none when it is gone."""
    listed = podman("exec", container, "ps", "-eo", "stat=,args=", check=False).stdout.splitlines()
    return [line for line in listed if "vllm" in line.lower() and not line.lstrip().startswith("Z")]


def test_pp2_ranks_inside_ray_containers_fail_with_the_worker_container_and_heal(
    control_plane, cluster, operator, agents, hub, ray_vllm_env, tmp_path
):
    env, made, python = ray_vllm_env
    user, workspace = operator
    hub.add_repo(MODEL, build(tmp_path / "tiny-llama", python))
    for name in ("rank-a", "rank-b"):
        agents(control_plane, cluster, user, name, extra_env=env)
    wait_until(lambda: Node.objects.filter(cluster=cluster, status="online").count() == 2, timeout=60, what="online")
    for node in Node.objects.filter(cluster=cluster):
        (download,) = services.command_dispatch(
            actor=user, cluster=cluster, command_type="model.download", payload={"model_id": MODEL}, node=node
        )
        wait_until(lambda d=download: Command.objects.get(pk=d.pk).status == "succeeded", timeout=120, what="download")

    created = time.monotonic()
    ray = ray_services.ray_cluster_create(
        actor=user,
        workspace=workspace,
        compute_cluster=cluster,
        name="pp",
        runtime="docker",
        ray_version=VERSION,
        serves_vllm=True,
        min_workers=1,
        max_workers=1,
        gcs_port=free_port(),
        dashboard_port=free_port(),
    )
    made.append(str(ray.pk))

    def explain() -> str:
        return evidence(str(ray.pk), tmp_path)

    wait_until(
        lambda: RayNode.objects.filter(ray_cluster=ray, status="running").count() == 2,
        timeout=400,
        interval=1,
        what="the Ray head and worker containers running",
    )
    ray_s = time.monotonic() - created
    head = RayNode.objects.get(ray_cluster=ray, role="head")
    worker = RayNode.objects.get(ray_cluster=ray, role="worker")
    assert sorted(containers_of(ray.pk)) == sorted([member_name(str(head.pk)), member_name(str(worker.pk))])

    asked = time.monotonic()
    endpoint = workload_services.endpoint_create(
        actor=user, cluster=cluster, model_id=MODEL, ray_cluster=ray, pipeline_parallel=2
    )
    leader, follower = EndpointReplica.objects.filter(endpoint=endpoint).order_by("group_rank")
    assert (leader.node_id, follower.node_id) == (head.node_id, worker.node_id)
    beat_until(
        lambda: status_of(endpoint) in ("running", "failed"),
        timeout=GROUP_START_S,
        what="the group running",
        explain=explain,
    )
    endpoint.refresh_from_db()
    assert endpoint.status == "running", f"{endpoint.failure_message}\n{explain()}"
    group_s = time.monotonic() - asked
    # each rank runs inside its Ray node's container, not beside its agent
    assert any("--headless" not in p for p in vllm_processes(member_name(str(head.pk))))
    assert any("--headless" in p for p in vllm_processes(member_name(str(worker.pk))))

    token = Token.objects.create(user=user)
    headers = {"Authorization": f"Token {token.key}", "Host": endpoint.hostname}
    first = complete(control_plane.url, headers, MODEL)
    assert first["usage"]["completion_tokens"] == 8

    # the worker's container dies, its rank with it: the group fails with the reason
    podman("kill", member_name(str(worker.pk)))
    killed = time.monotonic()
    failed = endpoint.events.filter(kind="endpoint.group_failed")
    beat_until(failed.exists, timeout=300, what="the group failed", explain=explain)
    failed_s = time.monotonic() - killed
    reason = failed.get().data["reason"]
    assert failed.get().data["code"] == "group_member_lost"
    # what the control plane saw first: the leader's probe failing (a pipeline missing its last stage
    # answers nothing), the follower's rank gone from its agent, or Ray no longer listing the worker
    assert (
        ("rank 0 (leader)" in reason and "unresponsive" in reason)
        or "rank 1 (follower)" in reason
        or f"Ray worker {worker.pk.hex[:8]}" in reason
    ), reason

    # the killed worker's container is removed from its node; another worker joins and the group heals
    beat_until(
        lambda: status_of(endpoint) == "running" and member_name(str(worker.pk)) not in containers_of(ray.pk),
        timeout=GROUP_START_S,
        what="the group running again, the killed worker's container removed",
        explain=explain,
    )
    healed_s = time.monotonic() - killed
    assert endpoint.events.filter(kind="endpoint.group_restarted").exists()
    again = complete(control_plane.url, headers, MODEL)
    assert again["choices"][0]["text"] == first["choices"][0]["text"]  # greedy: the same model answers alike
    print(
        f"\nRay head + worker containers running {ray_s:.0f} s after create; group running {group_s:.0f} s after "
        f"endpoint_create; failed {failed_s:.0f} s after the worker container's kill (reason: {reason[:160]}); "
        f"running again {healed_s:.0f} s after the kill"
    )
    resent = Command.objects.filter(node__cluster=cluster, attempts__gt=1).values_list("command_type", "attempts")
    print(f"commands sent more than once (the beat's resend or a reconnect): {sorted(resent)}")

    workload_services.endpoint_stop(actor=user, endpoint=endpoint)
    wait_until(lambda: status_of(endpoint) == "stopped", timeout=120, what="stopped")
    for ray_node in RayNode.objects.filter(ray_cluster=ray, status="running"):
        assert vllm_processes(member_name(str(ray_node.pk))) == []  # stop ended every rank in its container

    ray_services.ray_cluster_delete(actor=user, cluster=RayCluster.objects.get(pk=ray.pk))
    wait_until(lambda: not RayCluster.objects.filter(pk=ray.pk).exists(), timeout=180, what="Ray cluster deleted")
    wait_until(lambda: containers_of(ray.pk) == [], timeout=60, what="no container of the cluster left")

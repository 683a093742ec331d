"""Endpoints on a real agent without GPUs (vLLM's CPU build, here the OpenAI stand-in in its place):
placement admits no more servers than the node's reported cores (the next is refused with the reason), each
server bound to a core of its own; and a server the agent lost (its record gone, the endpoint stopped
meanwhile) is reported stray on the agent's return and ended by the endpoint's stop instead of answering
`not_found` and leaking. A rolling update of the server arguments on this one-node cluster whose replacement
fails (the server refuses the arguments, as vLLM refuses ones it cannot honour) keeps every request answered
by the old server, and the endpoint's page says why and what to do."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import psutil
import pytest
import requests
from django.urls import reverse
from rest_framework.authtoken.models import Token

from fleet import services
from fleet.models import Command
from fleet.workloads import services as workload_services
from fleet.workloads.models import EndpointReplica, EndpointStatus
from fleet.workloads.services import PlacementError
from tests.e2e.conftest import node_of, wait_status
from tests.support.live import agent_run
from tests.support.processes import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

# The OpenAI stand-in (in vLLM's place), refusing `--max-model-len 16` at start-up (as vLLM refuses a length
# it cannot serve).
REFUSING = (
    'sh -c \'case "$*" in *--max-model-len?16*) echo "ValueError: max_model_len 16 is refused"; exit 1;; '
    f'esac; exec {sys.executable} -m tests.support.openai_standin "$@"\' standin'
)


def environ_of(pid: int) -> dict[str, str]:
    return psutil.Process(pid).environ()


def server_pids(state: Path) -> list[int]:
    """The endpoint servers the agent with this state started that still run (its mark in their environment)."""
    wanted = str((state / "work" / "endpoints").resolve())
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get("CLEVERTHIS_ENDPOINT_STATE") == wanted and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.info["pid"])
        except psutil.Error:
            continue
    return found


@pytest.fixture
def cpu_node(control_plane, cluster, operator, agents):
    """One real agent (no GPU) serving the stand-in (`REFUSING`), with acme/tiny in its cache: (process, state,
    env, node)."""
    user, _ = operator
    proc, state, env = agents(
        control_plane,
        cluster,
        user,
        "cpu",
        extra_env={"CLEVERTHIS_ENDPOINT_SERVER": REFUSING, "CLEVERTHIS_VLLM_DEVICE": "cpu"},
    )
    node = node_of(state)
    wait_status(node, "online")
    (download,) = services.command_dispatch(
        actor=user, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}, node=node
    )
    wait_until(lambda: Command.objects.get(pk=download.pk).status == "succeeded", timeout=60, what="download")
    return proc, state, env, node


def running(endpoint) -> EndpointReplica:
    replica = EndpointReplica.objects.get(endpoint=endpoint)
    wait_until(
        lambda: EndpointReplica.objects.get(pk=replica.pk).status == EndpointStatus.RUNNING, timeout=60, what="running"
    )
    return EndpointReplica.objects.get(pk=replica.pk)


def test_a_cpu_node_takes_one_server_per_core_each_bound_to_its_own(cluster, operator, cpu_node):
    user, _ = operator
    _, state, _, node = cpu_node
    cores = node.cpu_count
    assert cores >= 1
    endpoints = [
        workload_services.endpoint_create(actor=user, cluster=cluster, model_id="acme/tiny") for _ in range(cores)
    ]
    with pytest.raises(PlacementError, match=f"node {node.name} has {cores}, held by the {cores} endpoint") as refused:
        workload_services.endpoint_create(actor=user, cluster=cluster, model_id="acme/tiny")
    assert refused.value.code == "insufficient_cpu"

    replicas = [running(e) for e in endpoints]
    records = json.loads((state / "work" / "endpoints" / "endpoints.json").read_text())
    binds = [environ_of(records[r.server_id]["pid"])["VLLM_CPU_OMP_THREADS_BIND"] for r in replicas]
    assert len(set(binds)) == cores  # no two servers share a core
    for replica, bind in zip(replicas, binds, strict=True):
        assert psutil.Process(records[replica.server_id]["pid"]).cpu_affinity() == [int(bind)]


def test_a_server_the_agent_lost_is_ended_by_the_endpoint_s_stop(cluster, operator, cpu_node, tmp_path):
    user, _ = operator
    proc, state, env, node = cpu_node
    endpoint = workload_services.endpoint_create(actor=user, cluster=cluster, model_id="acme/tiny")
    replica = running(endpoint)
    [pid] = server_pids(state)

    proc.stop()  # the agent goes away, and its record of the server with it (the server keeps running)
    wait_status(node, "offline", timeout=30)
    (state / "work" / "endpoints" / "endpoints.json").write_text("{}")
    workload_services.endpoint_stop(actor=user, endpoint=endpoint)  # queued until the node is back

    back = agent_run(state, tmp_path, name="agent-cpu-back", env=env)
    try:
        wait_until(
            lambda: EndpointReplica.objects.get(pk=replica.pk).status == EndpointStatus.STOPPED, timeout=60, what="stop"
        )
        stop = EndpointReplica.objects.get(pk=replica.pk).stop_command
        assert (stop.status, stop.error_code) == ("succeeded", "")  # not `not_found`: the agent found its stray
        wait_until(lambda: pid not in server_pids(state), timeout=20, what="the lost server to end")
        assert server_pids(state) == []
    finally:
        back.stop()


def test_a_failed_rolling_update_keeps_serving_and_the_page_says_why(
    control_plane, cluster, operator, cpu_node, client
):
    user, _ = operator
    _, _, _, node = cpu_node
    assert node.cpu_count >= 2, "the replacement needs a core beside its old replica"
    endpoint = workload_services.endpoint_create(actor=user, cluster=cluster, model_id="acme/tiny")
    old = running(endpoint)
    token = Token.objects.create(user=user)
    auth = {"Authorization": f"Token {token.key}", "Host": endpoint.hostname}
    answered, failed, stop = [], [], threading.Event()

    def keep_asking() -> None:
        while not stop.is_set():
            try:
                reply = requests.post(
                    f"{control_plane.url}/v1/chat/completions",
                    headers=auth,
                    json={"model": "acme/tiny", "messages": [{"role": "user", "content": "still there"}]},
                    timeout=60,
                )
                assert reply.status_code == 200, reply.text
                answered.append(reply.headers["x-served-by"])
            except Exception as exc:  # any failure is what this test is about
                failed.append(repr(exc))

    caller = threading.Thread(target=keep_asking)
    caller.start()
    try:
        workload_services.endpoint_update(actor=user, endpoint=endpoint, server_args=["--max-model-len", "16"])
        new = EndpointReplica.objects.get(replacement_of=old)
        ended = (EndpointStatus.FAILED, EndpointStatus.RUNNING)
        wait_until(lambda: EndpointReplica.objects.get(pk=new.pk).status in ended, timeout=60, what="replacement")
        new = EndpointReplica.objects.get(pk=new.pk)
        assert new.status == EndpointStatus.FAILED
        mark = len(answered)
        wait_until(lambda: len(answered) >= mark + 4, timeout=30, what="answers after the failed update")
    finally:
        stop.set()
        caller.join(60)
    assert failed == []
    assert set(answered) == {f"127.0.0.1:{old.port}"}  # the old server answered throughout
    endpoint.refresh_from_db()
    assert (endpoint.status, endpoint.server_args) == (EndpointStatus.RUNNING, [])  # back on what it serves

    client.force_login(user)
    page = client.get(reverse("workloads:endpoint_detail", args=[endpoint.pk])).content.decode()
    assert "The last update failed." in page
    assert "max_model_len 16 is refused" in page  # why: the server's own words
    assert f"Replica {old.server_id} keeps serving acme/tiny@main with no extra server arguments" in page
    assert "correct the server arguments or revision, then update again" in page

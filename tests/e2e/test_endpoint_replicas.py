"""An endpoint of two replicas on two real agents, through the control plane's tunnel proxy: requests
spread over both servers; once one agent dies every request is still answered, by the other; once its node
is offline the healing pass starts a replacement (on the surviving node, the only other one holding the
model) and requests spread over both servers again. The autoscaler adds a replica under load (on the
other node) and stops it again when idle, requests following. Rolling updates (a new revision; new server
arguments) answer every request on the way, and afterwards only the new servers answer.

vLLM cannot run here (its wheel pins a CUDA torch): each agent starts the OpenAI-compatible stand-in
`tests.support.openai_standin`, which names the server that answered (`X-Served-By`).
"""

from __future__ import annotations

import sys
import threading
from datetime import timedelta

import pytest
import requests
from django.db.models import F
from rest_framework.authtoken.models import Token

from fleet import services
from fleet.models import Command, NodeEvent
from fleet.workloads import services as workload_services
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.tasks import endpoints_heal_tick
from tests.e2e.conftest import node_of, wait_status
from tests.support.processes import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def two_nodes(control_plane, cluster, operator, agents):
    """Two real agents serving the stand-in, each with acme/tiny in its cache: {name: (process, node)}."""
    user, _ = operator
    server = {"CLEVERTHIS_ENDPOINT_SERVER": f"{sys.executable} -m tests.support.openai_standin"}
    started = {name: agents(control_plane, cluster, user, name, extra_env=server) for name in ("gpu-a", "gpu-b")}
    nodes = {name: (proc, node_of(state)) for name, (proc, state, _) in started.items()}
    for _, node in nodes.values():
        wait_status(node, "online")
        (download,) = services.command_dispatch(
            actor=user, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}, node=node
        )
        wait_until(lambda d=download: Command.objects.get(pk=d.pk).status == "succeeded", timeout=60, what="download")
    return nodes


def asker(control_plane, endpoint, user):
    """A function making one chat completion through the endpoint's URL (asserted answered)."""
    token = Token.objects.create(user=user)
    auth = {"Authorization": f"Token {token.key}", "Host": endpoint.hostname}

    def ask() -> requests.Response:
        answer = requests.post(
            f"{control_plane.url}/v1/chat/completions",
            headers=auth,
            json={"model": "acme/tiny", "messages": [{"role": "user", "content": "which one"}]},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "echo: which one"
        return answer

    return ask


def settled(replica_id) -> EndpointReplica:
    """The replica once it runs, failed or stopped."""
    done = (EndpointStatus.RUNNING, EndpointStatus.FAILED, EndpointStatus.STOPPED)
    wait_until(lambda: EndpointReplica.objects.get(pk=replica_id).status in done, timeout=60, what="replica")
    return EndpointReplica.objects.get(pk=replica_id)


def test_requests_spread_over_replicas_and_survive_an_agent_dying(control_plane, cluster, operator, two_nodes):
    user, _ = operator
    nodes = {name: node for name, (_, node) in two_nodes.items()}
    endpoint = workload_services.endpoint_create(actor=user, cluster=cluster, model_id="acme/tiny", min_replicas=2)
    replicas = EndpointReplica.objects.filter(endpoint=endpoint)
    assert [settled(r.pk).status for r in replicas.all()] == [EndpointStatus.RUNNING] * 2, [
        r.failure_message for r in replicas
    ]
    served_by = {r.node_id: f"127.0.0.1:{r.port}" for r in replicas.all()}
    assert set(served_by) == {node.pk for node in nodes.values()}  # one replica on each node
    ask = asker(control_plane, endpoint, user)

    assert {ask().headers["x-served-by"] for _ in range(6)} == set(served_by.values())

    proc, _ = two_nodes["gpu-a"]
    proc.kill()  # its tunnel goes; its server (a session of its own) keeps running, unreachable
    survivor = served_by[nodes["gpu-b"].pk]
    assert [ask().headers["x-served-by"] for _ in range(6)] == [survivor] * 6
    wait_status(nodes["gpu-a"], "offline")  # and once the node is offline its replica is out of rotation
    assert [ask().headers["x-served-by"] for _ in range(4)] == [survivor] * 4

    assert endpoints_heal_tick() == {str(endpoint.pk): 1}  # the beat's healing pass
    lost = replicas.get(node=nodes["gpu-a"])
    new = replicas.get(replacement_of=lost)
    assert new.node_id == nodes["gpu-b"].pk
    new = settled(new.pk)
    assert new.status == EndpointStatus.RUNNING, new.failure_message
    assert EndpointReplica.objects.get(pk=lost.pk).status == EndpointStatus.STOPPING  # waits for gpu-a's return
    fresh = f"127.0.0.1:{new.port}"
    wait_until(lambda: ask().headers["x-served-by"] == fresh, timeout=10, what="the replacement in rotation")
    assert {ask().headers["x-served-by"] for _ in range(6)} == {survivor, fresh}


def test_the_autoscaler_adds_a_replica_under_load_and_takes_it_away_when_idle(
    control_plane, cluster, operator, two_nodes
):
    user, _ = operator
    endpoint = workload_services.endpoint_create(
        actor=user,
        cluster=cluster,
        model_id="acme/tiny",
        max_replicas=2,
        target_requests_per_min=10,
        scale_cooldown_s=0,
    )
    (first,) = EndpointReplica.objects.filter(endpoint=endpoint)
    first = settled(first.pk)
    assert first.status == EndpointStatus.RUNNING, first.failure_message
    ask = asker(control_plane, endpoint, user)
    assert workload_services.endpoint_autoscale(endpoint_id=endpoint.pk) is None  # the first sample
    # 20 requests counted by the web server (it writes a burst's count with a request after its interval)
    wait_until(
        lambda: ask() and Endpoint.objects.get(pk=endpoint.pk).request_count >= 20,
        timeout=60,
        interval=0.2,
        what="the requests written",
    )
    sampled_at = Endpoint.objects.get(pk=endpoint.pk).load_sample_at
    up = workload_services.endpoint_autoscale(endpoint_id=endpoint.pk, now=sampled_at + timedelta(minutes=1))
    assert (up.replicas, up.wanted, up.changed) == (1, 2, 1), up.reason
    (added,) = EndpointReplica.objects.filter(endpoint=endpoint).exclude(pk=first.pk)
    assert added.node_id != first.node_id
    added = settled(added.pk)
    assert added.status == EndpointStatus.RUNNING, added.failure_message
    only_first = f"127.0.0.1:{first.port}"
    wait_until(lambda: ask().headers["x-served-by"] != only_first, timeout=10, what="the new replica in rotation")
    assert {ask().headers["x-served-by"] for _ in range(6)} == {only_first, f"127.0.0.1:{added.port}"}
    assert NodeEvent.objects.filter(node_id=added.node_id, kind="endpoint.scaled").exists()

    # idle: no request since the last sample, a minute later, asks for one replica again
    sampled_at = Endpoint.objects.get(pk=endpoint.pk).load_sample_at
    Endpoint.objects.filter(pk=endpoint.pk).update(load_sample_count=F("request_count"))
    down = workload_services.endpoint_autoscale(endpoint_id=endpoint.pk, now=sampled_at + timedelta(minutes=1))
    assert (down.replicas, down.wanted, down.changed) == (2, 1, -1), down.reason
    assert settled(added.pk).status == EndpointStatus.STOPPED
    assert {ask().headers["x-served-by"] for _ in range(4)} == {only_first}


def test_a_rolling_update_answers_every_request_on_the_way(control_plane, cluster, operator, two_nodes, hub, settings):
    settings.ENDPOINT_DRAIN_S = 3  # longer than the web server's route cache (PROXY_ROUTE_CACHE_S, 2 s)
    user, _ = operator
    hub.repos["acme/tiny"].branches.add("v2")
    for _, node in two_nodes.values():
        (download,) = services.command_dispatch(
            actor=user,
            cluster=cluster,
            command_type="model.download",
            payload={"model_id": "acme/tiny", "revision": "v2"},
            node=node,
        )
        wait_until(lambda d=download: Command.objects.get(pk=d.pk).status == "succeeded", timeout=60, what="v2")
    endpoint = workload_services.endpoint_create(actor=user, cluster=cluster, model_id="acme/tiny", min_replicas=2)
    olds = [settled(r.pk) for r in EndpointReplica.objects.filter(endpoint=endpoint)]
    assert [r.status for r in olds] == [EndpointStatus.RUNNING] * 2
    ask = asker(control_plane, endpoint, user)
    answered, failed, stop = [], [], threading.Event()

    def keep_asking() -> None:
        while not stop.is_set():
            try:
                answered.append(ask().headers["x-served-by"])
            except Exception as exc:  # any failure is what this test is about
                failed.append(repr(exc))

    caller = threading.Thread(target=keep_asking)
    caller.start()
    try:
        workload_services.endpoint_update(actor=user, endpoint=endpoint, revision="v2")
        news = [EndpointReplica.objects.get(replacement_of=old) for old in olds]
        assert [settled(n.pk).status for n in news] == [EndpointStatus.RUNNING] * 2
        wait_until(
            lambda: (
                endpoints_heal_tick() is not None
                and all(EndpointReplica.objects.get(pk=o.pk).status == EndpointStatus.STOPPED for o in olds)
            ),
            timeout=60,
            interval=0.5,
            what="the old replicas drained and stopped",
        )
        mark = len(answered)
        wait_until(lambda: len(answered) >= mark + 6, timeout=30, what="more answers")
    finally:
        stop.set()
        caller.join(60)
    assert failed == []
    new_servers = {f"127.0.0.1:{EndpointReplica.objects.get(pk=n.pk).port}" for n in news}
    assert set(answered[mark:]) == new_servers
    assert {f"127.0.0.1:{o.port}" for o in olds} <= set(answered[:mark])  # the old ones served before


def test_an_update_of_the_server_arguments_answers_every_request_and_the_new_args_take_effect(
    control_plane, cluster, operator, two_nodes, settings
):
    """The stand-in honours `--max-model-len` as vLLM does (its model list says `max_model_len`): a client
    calling the endpoint throughout sees no failure, and afterwards only new servers with the new length."""
    settings.ENDPOINT_DRAIN_S = 3  # longer than the web server's route cache (PROXY_ROUTE_CACHE_S, 2 s)
    user, _ = operator
    endpoint = workload_services.endpoint_create(
        actor=user, cluster=cluster, model_id="acme/tiny", min_replicas=2, server_args=["--max-model-len", "32"]
    )
    olds = [settled(r.pk) for r in EndpointReplica.objects.filter(endpoint=endpoint)]
    assert [r.status for r in olds] == [EndpointStatus.RUNNING] * 2, [r.failure_message for r in olds]
    ask = asker(control_plane, endpoint, user)
    auth = {"Authorization": ask().request.headers["Authorization"], "Host": endpoint.hostname}
    answered: list[tuple[str, int | None]] = []  # (server, its max_model_len; None for a chat completion)
    failed: list[str] = []
    stop = threading.Event()

    def keep_asking() -> None:
        while not stop.is_set():
            try:
                answered.append((ask().headers["x-served-by"], None))  # a chat completion, asserted answered
                listed = requests.get(f"{control_plane.url}/v1/models", headers=auth, timeout=60)
                assert listed.status_code == 200, listed.text
                answered.append((listed.headers["x-served-by"], listed.json()["data"][0]["max_model_len"]))
            except Exception as exc:  # any failure is what this test is about
                failed.append(repr(exc))

    caller = threading.Thread(target=keep_asking)
    caller.start()
    try:
        wait_until(lambda: len(answered) >= 4, timeout=30, what="answers before the update")
        workload_services.endpoint_update(actor=user, endpoint=endpoint, server_args=["--max-model-len 64"])
        news = [EndpointReplica.objects.get(replacement_of=old) for old in olds]
        assert [n.start_command.payload["extra_args"] for n in news] == [["--max-model-len", "64"]] * 2
        assert [settled(n.pk).status for n in news] == [EndpointStatus.RUNNING] * 2
        wait_until(
            lambda: (
                endpoints_heal_tick() is not None
                and all(EndpointReplica.objects.get(pk=o.pk).status == EndpointStatus.STOPPED for o in olds)
            ),
            timeout=60,
            interval=0.5,
            what="the old replicas drained and stopped",
        )
        mark = len(answered)
        wait_until(lambda: len(answered) >= mark + 6, timeout=30, what="more answers")
    finally:
        stop.set()
        caller.join(60)
    assert failed == []
    old_servers = {f"127.0.0.1:{o.port}" for o in olds}
    new_servers = {f"127.0.0.1:{EndpointReplica.objects.get(pk=n.pk).port}" for n in news}
    assert {length for server, length in answered[:mark] if server in old_servers} - {None} == {32}
    assert {server for server, _ in answered[mark:]} == new_servers
    assert {length for _, length in answered[mark:]} - {None} == {64}
    for server in new_servers:  # each new server, asked directly on its node
        listed = requests.get(f"http://{server}/v1/models", timeout=10).json()
        assert listed["data"][0]["max_model_len"] == 64

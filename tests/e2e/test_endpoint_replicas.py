"""An endpoint of two replicas on two real agents, through the control plane's tunnel proxy: requests
spread over both servers; once one agent dies every request is still answered, by the other; once its node
is offline the healing pass starts a replacement (on the surviving node, the only other one holding the
model) and requests spread over both servers again. The autoscaler adds a replica under load (on the
other node) and retires it again when idle, requests following; with a target of requests in flight it
adds one while streams are held open, reading the figures every web process publishes, and says why. A
server that hangs (SIGSTOP) is found by its agent's health probes: out of rotation, stopped, replaced.
Rolling updates (a new revision; new server arguments) answer every request on the way, and afterwards
only the new servers answer.

vLLM cannot run here (its wheel pins a CUDA torch): each agent starts the OpenAI-compatible stand-in
`tests.support.openai_standin`, which names the server that answered (`X-Served-By`).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from datetime import timedelta

import psutil
import pytest
import requests
from django.db.models import F
from rest_framework.authtoken.models import Token

from fleet import services
from fleet.models import Command, NodeEvent
from fleet.workloads import selectors
from fleet.workloads import services as workload_services
from fleet.workloads.models import Endpoint, EndpointEvent, EndpointReplica, EndpointStatus
from fleet.workloads.tasks import endpoints_autoscale_tick, endpoints_heal_tick
from tests.e2e.conftest import node_of, wait_status
from tests.support.processes import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


# Agents probing their servers' health often (every 0.2 s, 1 s timeout, 2 failures in a row), for tests of hangs.
FAST_PROBES = {
    "CLEVERTHIS_ENDPOINT_HEALTH_INTERVAL_S": "0.2",
    "CLEVERTHIS_ENDPOINT_HEALTH_TIMEOUT_S": "1",
    "CLEVERTHIS_ENDPOINT_HEALTH_FAILURES": "2",
}


@pytest.fixture
def two_nodes(control_plane, cluster, operator, agents, tmp_path):
    """Two real agents serving the stand-in, each with acme/tiny in its cache: {name: (process, node)}. Their
    streamed answers wait before their last word until `tmp_path / "stream-gate"` exists."""
    return start_two_nodes(control_plane, cluster, operator, agents, tmp_path)


@pytest.fixture
def two_probed_nodes(control_plane, cluster, operator, agents, tmp_path):
    """`two_nodes` whose agents probe their servers' health every 0.2 s."""
    return start_two_nodes(control_plane, cluster, operator, agents, tmp_path, FAST_PROBES)


def start_two_nodes(control_plane, cluster, operator, agents, tmp_path, extra_env=None):
    """Start two agents (gpu-a, gpu-b) serving the stand-in and download acme/tiny on each."""
    user, _ = operator
    standin = f"{sys.executable} -m tests.support.openai_standin --stream-gate {tmp_path / 'stream-gate'}"
    server = {"CLEVERTHIS_ENDPOINT_SERVER": standin, **(extra_env or {})}
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
    control_plane, cluster, operator, two_nodes, settings
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
    assert EndpointReplica.objects.get(pk=added.pk).retired_at is not None  # out of rotation, draining
    # once the web process's cached route (PROXY_ROUTE_CACHE_S) is renewed, only the first one answers
    wait_until(
        lambda: {ask().headers["x-served-by"] for _ in range(4)} == {only_first},
        timeout=10,
        what="the retired replica out of rotation",
    )
    settings.ENDPOINT_DRAIN_S = 0  # drained: the healing pass stops it
    endpoints_heal_tick()
    assert settled(added.pk).status == EndpointStatus.STOPPED


def wait_drained_and_stopped(olds: list[EndpointReplica]) -> None:
    """Run the healing pass until the replicas a rolling update replaced have drained and stopped."""
    wait_until(
        lambda: (
            endpoints_heal_tick() is not None
            and all(EndpointReplica.objects.get(pk=o.pk).status == EndpointStatus.STOPPED for o in olds)
        ),
        timeout=60,
        interval=0.5,
        what="the old replicas drained and stopped",
    )


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
        wait_drained_and_stopped(olds)
        mark = len(answered)
        wait_until(lambda: len(answered) >= mark + 6, timeout=30, what="more answers")
    finally:
        stop.set()
        caller.join(60)
    assert failed == []
    new_servers = {f"127.0.0.1:{EndpointReplica.objects.get(pk=n.pk).port}" for n in news}
    assert set(answered[mark:]) == new_servers
    assert {f"127.0.0.1:{o.port}" for o in olds} <= set(answered[:mark])  # the old ones served before


def test_a_replica_whose_server_hangs_leaves_rotation_is_stopped_and_replaced(
    control_plane, cluster, operator, two_probed_nodes
):
    user, _ = operator
    endpoint = workload_services.endpoint_create(actor=user, cluster=cluster, model_id="acme/tiny", min_replicas=2)
    replicas = EndpointReplica.objects.filter(endpoint=endpoint)
    assert [settled(r.pk).status for r in replicas.all()] == [EndpointStatus.RUNNING] * 2
    hung, other = replicas.order_by("created_at", "server_id")
    survivor = f"127.0.0.1:{other.port}"
    ask = asker(control_plane, endpoint, user)
    assert {ask().headers["x-served-by"] for _ in range(6)} == {survivor, f"127.0.0.1:{hung.port}"}

    pid = Command.objects.get(pk=hung.start_command_id).result["pid"]
    assert str(hung.port) in psutil.Process(pid).cmdline()  # the replica's server
    os.kill(pid, signal.SIGSTOP)  # alive, its port still accepts connections, it never answers
    try:
        wait_until(
            lambda: EndpointReplica.objects.get(pk=hung.pk).status == EndpointStatus.FAILED,
            timeout=30,
            what="the hung replica failed",
        )
        hung.refresh_from_db()
        assert hung.failure_code == "unresponsive", hung.failure_message
        assert NodeEvent.objects.filter(node_id=hung.node_id, kind="endpoint.unresponsive").exists()
        # its node's agent is told to stop it, and ends the stopped process
        wait_until(lambda: not _alive(pid), timeout=30, what="the hung server ended")
        stop = Command.objects.get(pk=hung.stop_command_id)
        wait_until(lambda: Command.objects.get(pk=stop.pk).status == "succeeded", timeout=30, what="the stop")
        assert [ask().headers["x-served-by"] for _ in range(4)] == [survivor] * 4

        assert endpoints_heal_tick() == {str(endpoint.pk): 1}  # the beat's healing pass
        new = settled(replicas.get(replacement_of=hung).pk)
        assert new.status == EndpointStatus.RUNNING, new.failure_message
        fresh = f"127.0.0.1:{new.port}"
        wait_until(lambda: ask().headers["x-served-by"] == fresh, timeout=10, what="the replacement in rotation")
        assert {ask().headers["x-served-by"] for _ in range(6)} == {survivor, fresh}
        assert EndpointReplica.objects.get(pk=hung.pk).status == EndpointStatus.FAILED  # why it went, kept
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """The process runs (or is stopped): not gone, not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_requests_held_in_flight_make_the_autoscaler_add_a_replica_and_say_why(
    control_plane, cluster, operator, two_nodes, tmp_path
):
    user, _ = operator
    endpoint = workload_services.endpoint_create(
        actor=user, cluster=cluster, model_id="acme/tiny", max_replicas=2, target_in_flight=2, scale_cooldown_s=0
    )
    (first,) = EndpointReplica.objects.filter(endpoint=endpoint)
    first = settled(first.pk)
    assert first.status == EndpointStatus.RUNNING, first.failure_message
    token = Token.objects.create(user=user)
    auth = {"Authorization": f"Token {token.key}", "Host": endpoint.hostname}
    body = {"model": "acme/tiny", "messages": [{"role": "user", "content": "which one"}], "stream": True}
    body["stream_options"] = {"include_usage": True}
    opened, answers, errors = threading.Semaphore(0), [], []

    def stream() -> None:
        try:
            with requests.post(
                f"{control_plane.url}/v1/chat/completions", headers=auth, json=body, stream=True, timeout=60
            ) as answer:
                lines = answer.iter_lines()
                assert next(line for line in lines if line.startswith(b"data:"))  # the first word: it is open
                opened.release()
                answers.append(b"\n".join(lines))  # the rest, once the gate opens
        except Exception as exc:  # (the test reports it)
            errors.append(repr(exc))
            opened.release()

    callers = [threading.Thread(target=stream) for _ in range(5)]
    for caller in callers:
        caller.start()
    gate = tmp_path / "stream-gate"
    try:
        for _ in callers:
            assert opened.acquire(timeout=60)
        assert errors == []

        def in_flight() -> int:
            load = selectors.replica_loads().get(first.server_id)
            return load.in_flight if load else 0

        # what the web process published (about every second), read as the beat's worker reads it
        wait_until(lambda: in_flight() == 5, timeout=20, interval=0.2, what="5 requests in flight, shared")
        api = requests.get(
            f"{control_plane.url}/api/v1/endpoints/{endpoint.pk}/",
            headers={"Authorization": f"Token {token.key}"},
            timeout=30,
        )
        (shown,) = api.json()["replicas"]
        assert shown["in_flight"] == 5

        assert endpoints_autoscale_tick() == {str(endpoint.pk): 1}  # the beat's task, for real
    finally:
        gate.touch()  # the held streams end
        for caller in callers:
            caller.join(60)
    assert errors == []
    assert len(answers) == 5
    assert all(b"[DONE]" in answer for answer in answers)
    (event,) = EndpointEvent.objects.filter(endpoint=endpoint, kind="endpoint.scaled")
    assert "scaled 1 → 2: 5 requests in flight over 1 replica(s), target 2 each" in event.message
    (added,) = EndpointReplica.objects.filter(endpoint=endpoint).exclude(pk=first.pk)
    assert added.node_id != first.node_id
    assert settled(added.pk).status == EndpointStatus.RUNNING

    # the streams ended: nothing stays in flight, and their completion tokens (3 words each) count for it
    def served() -> bool:
        load = selectors.replica_loads().get(first.server_id)
        return load is not None and (load.in_flight, load.tokens_total) == (0, 15) and load.tokens_per_s > 0

    wait_until(served, timeout=20, interval=0.2, what="nothing in flight, 15 tokens served")
    events = requests.get(
        f"{control_plane.url}/api/v1/endpoints/{endpoint.pk}/events/",
        headers={"Authorization": f"Token {token.key}"},
        timeout=30,
    ).json()["results"]
    (scaled,) = [e for e in events if e["kind"] == "endpoint.scaled"]
    assert "5 requests in flight" in scaled["message"]


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
        wait_drained_and_stopped(olds)
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

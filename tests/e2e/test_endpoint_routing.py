"""Routing policies end to end: an endpoint of two replicas on two real agents, called through the control
plane's tunnel proxy. With `prefix`, every turn of a conversation (its history resent and grown each turn)
is answered by the same server while the conversations spread over both; with `session`, requests sharing an
`X-Session-Id` are answered by one server whatever their text. The replicas' requests routed and affinity
hits, as the web process publishes them, count those requests; and when one agent dies every conversation
is still answered, by the other server. A rolling update under `prefix` answers every turn on the way, and
afterwards each conversation sticks to one of the new servers.

vLLM cannot run here (its wheel pins a CUDA torch) and which server answers does not depend on it: each
agent starts the OpenAI-compatible stand-in `tests.support.openai_standin`, which names the server that
answered (`X-Served-By`).
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable

import pytest
import requests
from rest_framework.authtoken.models import Token

from fleet import balancer
from fleet.proxy import affinity
from fleet.workloads import selectors
from fleet.workloads import services as workload_services
from fleet.workloads.models import EndpointReplica, EndpointStatus
from tests.e2e.test_endpoint_replicas import settled, start_two_nodes, wait_drained_and_stopped
from tests.support.processes import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SYSTEM = "You are a careful assistant. Answer briefly and cite nothing. " * 20
CONVERSATIONS = 11  # (odd: round robin over two servers would move each conversation every turn)


def spread_over_both(owner: Callable[[int], str], count: int) -> list[int]:
    """`count` indices from 0 whose keys the ring gives both servers: the first `count`, the last one swapped
    for the first later index owned by the other server when the ring put all of them on one (which hashing
    11 keys onto 2 servers does about once in 600 runs: 32 of 20,000 random rings)."""
    chosen = list(range(count))
    owners = {owner(i) for i in chosen}
    if len(owners) == 1:
        chosen[-1] = next(i for i in itertools.count(count) if owner(i) not in owners)
    return chosen


@pytest.fixture
def two_nodes(control_plane, cluster, operator, agents, tmp_path):
    return start_two_nodes(control_plane, cluster, operator, agents, tmp_path)


def caller(control_plane, endpoint, user):
    """A function posting one chat completion through the endpoint's URL; the server that answered."""
    token = Token.objects.create(user=user)
    auth = {"Authorization": f"Token {token.key}", "Host": endpoint.hostname}

    def call(messages: list[dict[str, str]], session: str | None = None) -> str:
        headers = {**auth, **({"X-Session-Id": session} if session else {})}
        answer = requests.post(
            f"{control_plane.url}/v1/chat/completions",
            headers=headers,
            json={"model": "acme/tiny", "messages": messages},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        return answer.headers["x-served-by"]

    return call


def test_prefix_and_session_affinity_through_the_proxy(control_plane, cluster, operator, two_nodes):
    user, _ = operator
    endpoint = workload_services.endpoint_create(
        actor=user, cluster=cluster, model_id="acme/tiny", min_replicas=2, routing_policy="prefix"
    )
    replicas = EndpointReplica.objects.filter(endpoint=endpoint)
    assert [settled(r.pk).status for r in replicas.all()] == [EndpointStatus.RUNNING] * 2
    servers = {f"127.0.0.1:{r.port}" for r in replicas.all()}
    call = caller(control_plane, endpoint, user)
    # where the ring puts a key when both replicas are free (the proxy's ring of the replicas' server ids)
    ring = balancer.Ring([r.server_id for r in replicas.all()])
    port_of = {r.server_id: f"127.0.0.1:{r.port}" for r in replicas.all()}

    def ring_server(key: bytes) -> str:
        return port_of[ring.owner(balancer.affinity_hash(key))]

    def opening(c: int) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"conversation {c}, turn 0: tell me more"},
        ]

    def prefix_server(c: int) -> str:  # (the key the proxy makes of the body `call` posts on turn 0)
        body = json.dumps({"model": "acme/tiny", "messages": opening(c)}).encode()
        return ring_server(affinity.affinity_key(balancer.PREFIX, {}, body))

    conversations = spread_over_both(prefix_server, CONVERSATIONS)
    histories = {c: opening(c)[:1] for c in conversations}
    served: dict[int, set[str]] = {c: set() for c in conversations}
    for turn in range(3):
        for c, history in histories.items():
            history.append({"role": "user", "content": f"conversation {c}, turn {turn}: tell me more"})
            served[c].add(call(history))
            history.append({"role": "assistant", "content": f"reply {turn}"})
    assert served == {c: {prefix_server(c)} for c in conversations}  # each conversation on its ring server
    assert set().union(*served.values()) == servers  # and the conversations used both

    # what the router did, as the web process publishes it (about every second)
    keys = {r.server_id for r in replicas.all()}

    def counted() -> tuple[int, int]:
        loads = selectors.replica_loads()
        return sum(loads[k].routed for k in keys if k in loads), sum(loads[k].affinity_hits for k in keys if k in loads)

    wait_until(lambda: counted() == (3 * CONVERSATIONS, 2 * CONVERSATIONS), timeout=15, what="routed and hits")

    workload_services.endpoint_set_routing(actor=user, endpoint=endpoint, routing_policy="session")

    def session_server(i: int) -> str:  # (the key the proxy makes of the X-Session-Id header `call` sends)
        return ring_server(
            affinity.affinity_key(balancer.SESSION, {"headers": [(b"x-session-id", f"s{i}".encode())]}, b"")
        )

    sessions: dict[str, set[str]] = {f"s{i}": set() for i in spread_over_both(session_server, CONVERSATIONS)}

    def session_sticks() -> bool:  # (the web process re-reads the route within PROXY_ROUTE_CACHE_S)
        for name, seen in sessions.items():
            seen.clear()
            for n in range(3):
                seen.add(call([{"role": "user", "content": f"unrelated text {n} of {name}"}], session=name))
        return all(len(s) == 1 for s in sessions.values())

    wait_until(session_sticks, timeout=15, what="session affinity")
    assert sessions == {name: {session_server(int(name[1:]))} for name in sessions}
    assert set().union(*sessions.values()) == servers

    proc, _ = two_nodes["gpu-a"]
    proc.kill()  # its replica's connects fail: every conversation goes on to the next server on the ring
    survivors = {call(history) for history in histories.values()}
    assert len(survivors) == 1
    assert survivors < servers


def test_a_rolling_update_under_prefix_routing_answers_every_turn(
    control_plane, cluster, operator, two_nodes, settings
):
    settings.ENDPOINT_DRAIN_S = 3  # longer than the web server's route cache (PROXY_ROUTE_CACHE_S, 2 s)
    user, _ = operator
    endpoint = workload_services.endpoint_create(
        actor=user, cluster=cluster, model_id="acme/tiny", min_replicas=2, routing_policy="prefix"
    )
    olds = [settled(r.pk) for r in EndpointReplica.objects.filter(endpoint=endpoint)]
    assert [r.status for r in olds] == [EndpointStatus.RUNNING] * 2
    call = caller(control_plane, endpoint, user)
    openings = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"topic {c}"}] for c in range(7)]
    answered: list[tuple[int, str]] = []
    failed: list[str] = []
    stop = threading.Event()

    def keep_talking() -> None:
        turn = 0
        while not stop.is_set():
            c = turn % len(openings)
            try:
                answered.append((c, call([*openings[c], {"role": "user", "content": f"turn {turn}"}])))
            except Exception as exc:  # any failure is what this test is about
                failed.append(repr(exc))
            turn += 1

    talker = threading.Thread(target=keep_talking)
    talker.start()
    try:
        workload_services.endpoint_update(actor=user, endpoint=endpoint, server_args=["--max-model-len", "8192"])
        news = [EndpointReplica.objects.get(replacement_of=old) for old in olds]
        assert [settled(n.pk).status for n in news] == [EndpointStatus.RUNNING] * 2
        wait_drained_and_stopped(olds)
        mark = len(answered)
        wait_until(lambda: len(answered) >= mark + 3 * len(openings), timeout=60, what="more turns")
    finally:
        stop.set()
        talker.join(60)
    assert failed == []
    new_servers = {f"127.0.0.1:{EndpointReplica.objects.get(pk=n.pk).port}" for n in news}
    after: dict[int, set[str]] = {}
    for c, server in answered[mark:]:
        after.setdefault(c, set()).add(server)
    assert all(len(s) == 1 for s in after.values()), after  # each conversation on one new server
    assert set().union(*after.values()) <= new_servers

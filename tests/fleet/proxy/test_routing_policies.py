"""Routing policies (`fleet.balancer`, `fleet.proxy.affinity`): the consistent-hash ring (about 1/N of the
keys move when a replica comes or goes), bounded load (a hot key passes on instead of piling up), least load
over the in-flight figures all web processes share (refreshed in the background by the load publisher),
the affinity keys read from a request, the affinity-hit counts, and the relay routing by the policy."""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from typing import Any

import pytest

from fleet import balancer, replica_load
from fleet.balancer import Lease, Ring, Upstream
from fleet.proxy import affinity, relay, resolvers
from fleet.replica_load import LoadPublisher
from kernel.asgi_scope import API_KEY_ID_SCOPE_KEY
from tests.fleet.proxy.test_balancer import agents, status_of  # noqa: F401  (the stand-in agents fixture)

KEYS = [f"conversation-{i}".encode() for i in range(20_000)]


@pytest.fixture(autouse=True)
def _no_leftover_counts():
    """Each test starts and ends with nothing in flight and no shared figures in this process."""
    balancer._outstanding.clear()
    balancer.discard()
    yield
    balancer._outstanding.clear()
    balancer.discard()


def upstreams(n: int) -> tuple[Upstream, ...]:
    return tuple(Upstream(key=f"replica{i:02d}", node_id=uuid.uuid4(), port=8000 + i) for i in range(n))


def owners(ring: Ring) -> list[str | None]:
    return [ring.owner(balancer.affinity_hash(k)) for k in KEYS]


@pytest.mark.parametrize("n", [2, 4, 8])
def test_adding_a_replica_moves_about_one_in_n_plus_one_keys_and_only_to_the_new_one(n):
    keys = [f"replica{i:02d}" for i in range(n)]
    before, after = owners(Ring(keys)), owners(Ring([*keys, "newcomer"]))
    moved = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert all(b == "newcomer" for _, b in moved)  # nothing moves between the old replicas
    share = len(moved) / len(KEYS)
    assert 0.6 / (n + 1) < share < 1.4 / (n + 1)


@pytest.mark.parametrize("n", [3, 8])
def test_removing_a_replica_moves_only_its_own_keys(n):
    keys = [f"replica{i:02d}" for i in range(n)]
    before, after = owners(Ring(keys)), owners(Ring(keys[1:]))
    moved = [a for a, b in zip(before, after, strict=True) if a != b]
    assert set(moved) == {keys[0]}
    assert 0.6 / n < len(moved) / len(KEYS) < 1.4 / n


def test_virtual_nodes_spread_the_keys_evenly():
    counts: dict[str | None, int] = {}
    for owner in owners(Ring([f"replica{i:02d}" for i in range(8)])):
        counts[owner] = counts.get(owner, 0) + 1
    mean = len(KEYS) / 8
    assert len(counts) == 8
    assert all(0.7 * mean < c < 1.3 * mean for c in counts.values())


def test_a_key_sticks_to_its_replica_and_a_tried_one_passes_it_to_the_next_on_the_ring():
    replicas = upstreams(4)
    h = balancer.affinity_hash(b"chat-1")
    home = balancer.ring_of(tuple(u.key for u in replicas)).owner(h)
    for _ in range(3):
        lease = Lease(replicas, balancer.PREFIX, b"chat-1")
        assert lease.take().key == home
        second = lease.take()  # (its connect failed: the next on the ring, not the home again)
        assert second.key != home
        assert second.key == list(balancer.ring_of(tuple(u.key for u in replicas)).walk(h))[1]
        lease.release()
    assert all(balancer.outstanding(u.key) == 0 for u in replicas)


@pytest.mark.parametrize("epsilon", [0.25, 1.0])
def test_a_hot_key_passes_on_past_the_bound_instead_of_piling_onto_one_replica(epsilon):
    replicas = upstreams(4)
    held = [Lease(replicas, balancer.PREFIX, b"one hot system prompt", epsilon) for _ in range(40)]
    for count, lease in enumerate(held, start=1):
        lease.take()
        loads = [balancer.outstanding(u.key) for u in replicas]
        assert max(loads) <= math.ceil((1 + epsilon) * count / len(replicas))  # the bound, with it counted
    busy = sum(1 for u in replicas if balancer.outstanding(u.key) > 0)
    assert busy >= math.ceil(len(replicas) / (1 + epsilon))  # spread over as many as the bound needs
    first = held[0].current.key
    for lease in held:
        lease.release()
    assert Lease(replicas, balancer.PREFIX, b"one hot system prompt", epsilon).take().key == first  # home again


def test_least_load_counts_what_the_other_web_processes_have_in_flight():
    a, b = upstreams(2)
    balancer.set_shared({a.key: 5, b.key: 2}, own_published={b.key: 2})  # the 2 on b were this process's
    assert (balancer.load(a.key), balancer.load(b.key)) == (5, 0)
    assert {Lease((a, b)).take().key for _ in range(3)} == {b.key}  # (leases not released: b climbs to 3)
    assert balancer.load(b.key) == 3
    balancer._outstanding.clear()
    balancer.set_shared({}, {})
    assert balancer.load(a.key) == 0


def test_bounded_load_counts_the_other_processes_too():
    replicas = upstreams(2)
    h = balancer.affinity_hash(b"k")
    home = balancer.ring_of(tuple(u.key for u in replicas)).owner(h)
    balancer.set_shared({home: 10}, {})  # the other processes keep the home busy
    assert Lease(replicas, balancer.SESSION, b"k").take().key != home
    balancer._outstanding.clear()


@pytest.mark.asyncio
async def test_the_publisher_loop_refreshes_the_shared_figures_in_the_background(settings):
    settings.REPLICA_LOAD_PUBLISH_S = 0.02
    other = LoadPublisher(name=f"test-other-{uuid.uuid4().hex[:6]}")
    here = LoadPublisher(name=f"test-here-{uuid.uuid4().hex[:6]}")
    try:
        other.publish({"busy-replica": (4, 0, 0.0)})
        lease = Lease(upstreams(1))
        mine = lease.take()
        here.ensure_running()
        for _ in range(500):
            if balancer.load("busy-replica") == 4 and replica_load.read().get(mine.key):
                break
            await asyncio.sleep(0.01)
        assert balancer.load("busy-replica") == 4  # the other process's, from the background copy
        await asyncio.sleep(0.1)
        assert balancer.load(mine.key) == 1  # this process's own lease, not counted twice
        lease.release()
    finally:
        if here._task is not None:
            here._task.cancel()
        other.publish({})
        here.publish({})


def test_affinity_hits_count_a_key_that_returns_to_the_same_replica():
    replicas = upstreams(3)
    for key in (b"a", b"b", b"a", b"a", b"b"):
        lease = Lease(replicas, balancer.SESSION, key)
        lease.take()
        lease.release()
    routed = balancer.routed()
    assert sum(n for n, _ in routed.values()) == 5
    assert sum(h for _, h in routed.values()) == 3  # the second and third "a", the second "b"
    plain = Lease(replicas)
    plain.take()
    plain.release()
    assert sum(h for _, h in balancer.routed().values()) == 3  # least_load: no key, no hit


def chat(*messages: tuple[str, str], **extra: Any) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": r, "content": c} for r, c in messages], **extra}).encode()


def test_the_session_key_is_the_header_else_the_user_field_else_the_api_key():
    body = chat(("user", "hi"), user="alice")
    assert affinity.session_key({"headers": [(b"x-session-id", b"s-1")]}, body) == b"session:s-1"
    assert affinity.session_key({"headers": []}, body) == b"user:alice"
    assert affinity.session_key({"headers": [], API_KEY_ID_SCOPE_KEY: 7}, chat(("user", "hi"))) == b"key:7"
    assert affinity.session_key({"headers": []}, chat(("user", "hi"))) is None
    assert affinity.affinity_key(balancer.LEAST_LOAD, {"headers": []}, body) is None


def test_the_prefix_key_is_a_conversation_s_leading_messages_the_same_on_every_turn(settings):
    system = ("system", "You are helpful. " * 100)
    turn1 = chat(system, ("user", "Plan a trip to Oslo"))
    turn2 = chat(system, ("user", "Plan a trip to Oslo"), ("assistant", "Sure..."), ("user", "And Bergen?"))
    other = chat(system, ("user", "Write a poem"))
    assert affinity.prefix_key(turn1) == affinity.prefix_key(turn2)
    assert affinity.prefix_key(turn1) != affinity.prefix_key(other)
    assert affinity.prefix_key(turn1).startswith(b"system\nYou are helpful.")
    settings.ROUTING_PREFIX_CHARS = 50  # capped: the system prompt's start and the first user message's end
    assert affinity.prefix_key(turn1) == affinity.prefix_key(turn2)
    assert affinity.prefix_key(turn1) != affinity.prefix_key(other)
    assert len(affinity.prefix_key(turn1)) == len(affinity.prefix_key(other)) == 50
    assert affinity.prefix_key(turn1).startswith(b"system\nYou are helpful.")
    assert affinity.prefix_key(turn1).endswith(b"user\nPlan a trip to Oslo\n")
    assert affinity.prefix_key(json.dumps({"prompt": "x" * 80}).encode()) == b"x" * 50
    assert affinity.prefix_key(json.dumps({"prompt": [[1, 2, 3]]}).encode()) == b"1 2 3"
    assert affinity.prefix_key(b"not json at all, but a body") == b"not json at all, but a body"
    assert affinity.prefix_key(b"") is None
    huge = chat(system, ("user", "x" * affinity.PARSE_MAX_BYTES))  # not parsed: its first bytes are its key
    assert affinity.prefix_key(huge) == huge[:50]


async def post(replicas: tuple[Upstream, ...], policy: str, body: bytes, headers: list | None = None) -> int:
    """One POST through `relay.proxy_http` routed by `policy`; the response's status."""
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "query_string": b""}
    scope["headers"] = [(b"content-length", str(len(body)).encode()), *(headers or [])]
    target = resolvers.ProxyTarget(
        node_id=replicas[0].node_id, port=replicas[0].port, path=scope["path"], replicas=replicas, routing=policy
    )
    await asyncio.wait_for(relay.proxy_http(scope, receive, send, target), timeout=30)
    return status_of(sent)


@pytest.mark.asyncio
async def test_the_relay_sends_each_conversation_to_one_replica_by_prefix_and_by_session(agents):  # noqa: F811
    made = [agents("answer") for _ in range(3)]
    replicas = tuple(u for u, _ in made)
    system = ("system", "shared system prompt " * 50)

    def served() -> list[int]:
        return [len(agent.openings) for _, agent in made]

    for conversation in range(6):
        before = served()
        history = [system, ("user", f"question {conversation}")]
        for turn in range(3):
            assert await post(replicas, balancer.PREFIX, chat(*history)) == 200
            history += [("assistant", f"answer {turn}"), ("user", f"follow-up {turn}")]
        grew = [a - b for a, b in zip(served(), before, strict=True)]
        assert sorted(grew) == [0, 0, 3]  # every turn on the same replica
    for session in range(6):
        before = served()
        for turn in range(3):
            header = [(b"x-session-id", f"s{session}".encode())]
            assert await post(replicas, balancer.SESSION, chat(("user", f"different text {turn}")), header) == 200
        grew = [a - b for a, b in zip(served(), before, strict=True)]
        assert sorted(grew) == [0, 0, 3]
    routed = balancer.routed()
    assert sum(n for n, _ in routed.values()) == 36
    assert sum(h for _, h in routed.values()) == 24  # each conversation's turns after its first
    assert all(balancer.outstanding(u.key) == 0 for u in replicas)

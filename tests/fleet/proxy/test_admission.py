"""Admission (`fleet.admission`): the concurrency limit per replica, the wait queue served round-robin over
callers, 429 past its depth or wait bound, the share a process keeps to while other processes wait, and the
relay answering 429 with Retry-After and a JSON reason through stand-in agents."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from fleet import admission, balancer
from fleet.admission import QueuePolicy, Refusal, concurrency_limit
from fleet.balancer import Upstream
from fleet.proxy import relay, resolvers
from tests.fleet.proxy.test_balancer import agents, status_of  # noqa: F401  (the stand-in agents fixture)


@pytest.fixture(autouse=True)
def _clean():
    balancer._outstanding.clear()
    balancer.discard()
    admission.discard()
    yield
    balancer._outstanding.clear()
    balancer.discard()
    admission.discard()


def policy(limit: int = 1, depth: int = 100, wait_s: float = 30.0) -> QueuePolicy:
    return QueuePolicy(endpoint=uuid.uuid4().hex, limit=limit, depth=depth, wait_s=wait_s)


def replicas(n: int = 1) -> tuple[Upstream, ...]:
    return tuple(Upstream(key=f"r{i}-{uuid.uuid4().hex[:6]}", node_id=uuid.uuid4(), port=8000) for i in range(n))


def test_the_limit_is_the_endpoint_s_own_else_max_num_seqs_else_vllm_s_default():
    assert concurrency_limit([], None) == 256
    assert concurrency_limit(["--max-num-seqs", "8"], None) == 8
    assert concurrency_limit(["--dtype", "half", "--max-num-seqs=12"], None) == 12
    assert concurrency_limit(["--max-num-seqs", "8"], 3) == 3
    assert concurrency_limit(["--max-num-seqs"], None) == 256  # (no value: the default)


@pytest.mark.asyncio
async def test_a_full_replica_takes_no_more_and_a_freed_slot_goes_to_the_next_caller_in_turn():
    queue, ups = policy(limit=2), replicas(2)
    held = [admission.lease_for(queue, ups) for _ in range(4)]
    for lease in held:
        assert await admission.gate(queue).admit(lease, "holder") in ups
    assert [balancer.outstanding(u.key) for u in ups] == [2, 2]  # the limit, on each replica

    order: list[str] = []

    async def wait(caller: str) -> None:
        lease = admission.lease_for(queue, ups)
        found = await admission.gate(queue).admit(lease, caller)
        assert found in ups
        order.append(caller)
        held.append(lease)

    greedy = [asyncio.ensure_future(wait("greedy")) for _ in range(6)]
    await asyncio.sleep(0)
    polite = [asyncio.ensure_future(wait("polite")) for _ in range(2)]
    await asyncio.sleep(0)
    assert admission.gate(queue).waiting == 8
    for _ in range(8):  # one slot frees at a time
        held.pop(0).release()
        await asyncio.sleep(0)
    await asyncio.gather(*greedy, *polite)
    assert order[:4] == ["greedy", "polite", "greedy", "polite"]  # the later caller is not starved
    assert sum(balancer.outstanding(u.key) for u in ups) == 4
    for lease in held:
        lease.release()
    assert sum(balancer.outstanding(u.key) for u in ups) == 0


@pytest.mark.asyncio
async def test_past_the_depth_or_the_wait_bound_a_request_is_refused_with_a_retry_after():
    queue, ups = policy(limit=1, depth=1, wait_s=0.05), replicas(1)
    first = admission.lease_for(queue, ups)
    assert await admission.gate(queue).admit(first, "a") == ups[0]
    waiting = asyncio.ensure_future(admission.gate(queue).admit(admission.lease_for(queue, ups), "b"))
    await asyncio.sleep(0)
    full = await admission.gate(queue).admit(admission.lease_for(queue, ups), "c")
    assert isinstance(full, Refusal)
    assert full.reason == "queue_full"
    assert full.retry_after >= 1
    late = await waiting
    assert isinstance(late, Refusal)
    assert late.reason == "queue_timeout"
    assert json.loads(late.body())["error"]["type"] == "queue_timeout"
    assert admission.gate(queue).waiting == 0  # (the one that timed out left the queue)
    assert balancer.outstanding(ups[0].key) == 1  # only the first holds a slot
    first.release()


@pytest.mark.asyncio
async def test_while_other_processes_wait_this_one_keeps_to_its_share_of_the_slots():
    queue, ups = policy(limit=4), replicas(1)
    held = [admission.lease_for(queue, ups) for _ in range(4)]
    for lease in held:
        await admission.gate(queue).admit(lease, "here")
    mine = [asyncio.ensure_future(admission.gate(queue).admit(admission.lease_for(queue, ups), "here"))]
    await asyncio.sleep(0)
    admission.set_shared({queue.endpoint: 5}, {queue.endpoint: 0})  # another process: 5 waiting, none in flight
    for lease in held[:3]:
        lease.release()  # 3 slots free here...
    # (its demand, 1 in flight + 1 waiting, against the other's 5: a share of 2 slots)
    assert await asyncio.wait_for(mine[0], timeout=5) == ups[0]
    assert balancer.outstanding(ups[0].key) == 2  # ...and 2 are left for the other process to see and fill
    for lease in held:
        lease.release()
    balancer._outstanding.clear()


async def call(target: resolvers.ProxyTarget, scope_extra: dict | None = None) -> list[dict]:
    sent: list[dict] = []
    messages = [{"type": "http.request", "body": b"{}", "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "query_string": b"", "headers": []}
    await relay.proxy_http({**scope, **(scope_extra or {})}, receive, send, target)
    return sent


@pytest.mark.asyncio
async def test_the_relay_answers_429_with_retry_after_and_a_json_reason_when_the_queue_is_full(agents):  # noqa: F811
    (busy, agent) = agents("stream")  # its answer never ends: the one slot stays taken
    queue = policy(limit=1, depth=0)
    target = resolvers.ProxyTarget(node_id=busy.node_id, port=busy.port, path="/", replicas=(busy,), queue=queue)
    holder = asyncio.ensure_future(call(target))
    for _ in range(100):
        if balancer.outstanding(busy.key):
            break
        await asyncio.sleep(0.01)
    sent = await asyncio.wait_for(call(target), timeout=10)
    assert status_of(sent) == 429
    head = next(m for m in sent if m["type"] == "http.response.start")
    assert (b"retry-after", b"1") in head["headers"]
    error = json.loads(b"".join(m.get("body", b"") for m in sent))["error"]
    assert error["type"] == "queue_full"
    assert error["retry_after"] == 1
    assert len(agent.openings) == 1  # the refused request never reached the server
    holder.cancel()


@pytest.mark.asyncio
async def test_a_waiter_takes_a_replica_added_while_it_waited():
    queue, (old,) = policy(limit=1), replicas(1)
    holder = admission.lease_for(queue, (old,))
    assert await admission.gate(queue).admit(holder, "a") == old
    waiting = asyncio.ensure_future(admission.gate(queue).admit(admission.lease_for(queue, (old,)), "b"))
    await asyncio.sleep(0)
    (new,) = replicas(1)  # a scale-up: the route now lists both; the next request brings it to the gate
    later = asyncio.ensure_future(admission.gate(queue).admit(admission.lease_for(queue, (old, new)), "c"))
    assert await asyncio.wait_for(waiting, timeout=5) == new  # the one waiting first gets the new replica
    assert not later.done()  # (the later one waits its turn, though it came knowing both)
    holder.release()
    assert await asyncio.wait_for(later, timeout=5) == old
    assert [balancer.outstanding(u.key) for u in (old, new)] == [1, 1]
    balancer._outstanding.clear()


@pytest.mark.asyncio
async def test_a_client_that_leaves_while_waiting_leaves_the_queue(agents):  # noqa: F811
    (busy, _) = agents("stream")
    queue = policy(limit=1)
    target = resolvers.ProxyTarget(node_id=busy.node_id, port=busy.port, path="/", replicas=(busy,), queue=queue)
    holder = asyncio.ensure_future(call(target))
    for _ in range(100):
        if balancer.outstanding(busy.key):
            break
        await asyncio.sleep(0.01)
    left = asyncio.Event()
    messages = [{"type": "http.request", "body": b"{}", "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        await left.wait()
        return {"type": "http.disconnect"}

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "query_string": b"", "headers": []}
    leaving = asyncio.ensure_future(relay.proxy_http(scope, receive, send, target))
    for _ in range(100):
        if admission.gate(queue).waiting:
            break
        await asyncio.sleep(0.01)
    assert admission.gate(queue).waiting == 1
    left.set()
    await asyncio.wait_for(leaving, timeout=5)
    assert admission.gate(queue).waiting == 0  # gone from the queue: no slot will be handed to it
    assert sent == []  # (nobody to answer)
    assert balancer.outstanding(busy.key) == 1  # only the holder
    holder.cancel()

"""Balancing an endpoint's requests over its replicas: the least busy first, in-flight counts back to zero
however a request ended, and a connect failure tried once on another replica.

`relay.proxy_http` runs for real against tunnels held by this process: stand-ins of agents registered in
`local_tunnels` that answer, refuse (as an agent does when nothing listens on the port), or stream forever.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from fleet import balancer
from fleet.balancer import Lease, Upstream
from fleet.proxy import relay, resolvers
from fleet.tunnel import local_tunnels

OK = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok"
STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


class AgentStandIn:
    """A node's tunnel held by this process; `mode` says how it answers each stream: "answer", "refuse"
    (nothing listens on the port), "closed" (the tunnel closed before an answer: its agent died), "stream"
    (a response that never ends) or "cut" (ends mid-response)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.openings: list[dict[str, Any]] = []

    async def node_command(self, message: dict[str, Any]) -> None:
        pass

    async def stream_message(self, message: dict[str, Any]) -> None:
        pass

    async def open_local_stream(self, stream: Any, opening: dict[str, Any]) -> None:
        self.openings.append(opening)
        loop = asyncio.get_running_loop()
        if self.mode == "refuse":
            error = f"cannot connect to port {opening['port']}: [Errno 111] Connection refused"
            loop.call_soon(stream.deliver, {"type": "stream.end", "error": error})
        elif self.mode == "closed":
            loop.call_soon(stream.deliver, {"type": "stream.end", "error": "tunnel closed"})
        elif self.mode == "answer":
            loop.call_soon(stream.deliver, {"type": "stream.data", "data": OK})
            loop.call_soon(stream.deliver, {"type": "stream.end", "error": ""})
        else:
            loop.call_soon(stream.deliver, {"type": "stream.data", "data": STREAM_HEAD + b"6\r\ndata:1\r\n"})
            if self.mode == "cut":
                loop.call_soon(stream.deliver, {"type": "stream.end", "error": "upstream reset"})


@pytest.fixture
def agents():
    """Make stand-in tunnels for new node ids; each is an `Upstream` at port 8001."""
    made: list[tuple[uuid.UUID, AgentStandIn]] = []

    def make(mode: str) -> tuple[Upstream, AgentStandIn]:
        node_id, agent = uuid.uuid4(), AgentStandIn(mode)
        local_tunnels.add(node_id, agent)
        made.append((node_id, agent))
        return Upstream(key=node_id.hex[:12], node_id=node_id, port=8001), agent

    yield make
    for node_id, agent in made:
        local_tunnels.discard(node_id, agent)


async def call(replicas: tuple[Upstream, ...], *, leave_after_first_byte: bool = False) -> list[dict[str, Any]]:
    """One GET through `relay.proxy_http` to an endpoint of these replicas; the messages sent to the client."""
    sent: list[dict[str, Any]] = []
    got_body = asyncio.Event()
    messages = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        if leave_after_first_byte:
            await got_body.wait()
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()  # the client stays
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            got_body.set()

    scope = {"type": "http", "method": "GET", "path": "/v1/models", "query_string": b"", "headers": []}
    target = resolvers.ProxyTarget(
        node_id=replicas[0].node_id, port=replicas[0].port, path="/v1/models", replicas=replicas
    )
    await asyncio.wait_for(relay.proxy_http(scope, receive, send, target), timeout=30)
    return sent


def status_of(sent: list[dict[str, Any]]) -> int:
    return next(m["status"] for m in sent if m["type"] == "http.response.start")


def test_the_replica_with_fewest_requests_in_flight_is_chosen_and_ties_take_turns():
    a, b, c = (Upstream(key=k, node_id=uuid.uuid4(), port=1) for k in "abc")
    held = [Lease((a, b, c)) for _ in range(3)]
    assert sorted(lease.take().key for lease in held) == ["a", "b", "c"]  # one each
    extra = Lease((a, b, c))
    held[1].release()  # one of them finished: it is now the least busy
    freed = held[1].tried[0]
    assert extra.take().key == freed
    assert balancer.outstanding(freed) == 1
    for lease in [*held, extra]:
        lease.release()
        lease.release()  # giving it back twice counts once
    assert [balancer.outstanding(k) for k in "abc"] == [0, 0, 0]
    assert {balancer.choose((a, b)).key for _ in range(4)} == {"a", "b"}  # idle replicas take turns
    assert balancer.choose((a, b), exclude=("a", "b")) is None


@pytest.mark.asyncio
async def test_requests_spread_over_the_replicas_and_counts_return_to_zero(agents):
    (a, agent_a), (b, agent_b) = agents("answer"), agents("answer")
    for _ in range(4):
        sent = await call((a, b))
        assert status_of(sent) == 200
        assert b"".join(m.get("body", b"") for m in sent) == b"ok"
    assert (len(agent_a.openings), len(agent_b.openings)) == (2, 2)
    assert (balancer.outstanding(a.key), balancer.outstanding(b.key)) == (0, 0)


@pytest.mark.parametrize("failure", ["refuse", "closed"])
@pytest.mark.asyncio
async def test_a_refused_connect_goes_once_to_another_replica(agents, failure):
    (bad, refusing), (good, answering) = agents(failure), agents("answer")
    for _ in range(2):  # whichever is tried first, each request ends on the good one
        assert status_of(await call((bad, good))) == 200
    assert len(answering.openings) == 2
    assert len(refusing.openings) >= 1
    assert (balancer.outstanding(bad.key), balancer.outstanding(good.key)) == (0, 0)


@pytest.mark.asyncio
async def test_a_retry_is_made_once_only_and_then_the_client_gets_502(agents):
    replicas = tuple(agents("refuse") for _ in range(3))
    sent = await call(tuple(u for u, _ in replicas))
    assert status_of(sent) == 502
    assert b"cannot connect" in b"".join(m.get("body", b"") for m in sent)
    assert sum(len(agent.openings) for _, agent in replicas) == 2
    assert all(balancer.outstanding(u.key) == 0 for u, _ in replicas)


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_node_whose_tunnel_is_gone_fails_over_to_another_replica(agents, node, settings):
    settings.PROXY_DIAL_GRACE_S = 0.3
    gone = Upstream(key="gone00000000", node_id=node.pk, port=8001)  # a real node row, no tunnel held
    good, answering = agents("answer")
    for _ in range(2):
        assert status_of(await call((gone, good))) == 200
    assert len(answering.openings) == 2
    assert (balancer.outstanding(gone.key), balancer.outstanding(good.key)) == (0, 0)


@pytest.mark.asyncio
async def test_streams_the_client_left_or_the_node_cut_count_down_too(agents):
    endless, _ = agents("stream")
    sent = await call((endless,), leave_after_first_byte=True)
    assert status_of(sent) == 200
    assert balancer.outstanding(endless.key) == 0
    cut, _ = agents("cut")
    sent = await call((cut,))
    assert status_of(sent) == 200  # the head went out; the client sees the body cut short
    assert balancer.outstanding(cut.key) == 0

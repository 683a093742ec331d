"""The control plane's side of make-before-break moves (`fleet.tunnel.drain`), driven through the real ASGI
application over the real Redis channel layer and PostgreSQL: a newer tunnel of the node supersedes the
older one (which closes 1000 once its streams ended), a draining process sends `Move` to an agent that
speaks protocol 6 and closes an older agent's tunnel (1012) once idle, and refuses new tunnels.
The whole move with real processes and a real agent: tests/e2e/test_tunnel_moves.py."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlencode

import pytest
from channels.testing import WebsocketCommunicator

from agent import protocol as p
from cleverthis.asgi import application
from fleet.proxy.streams import TunnelStream
from fleet.tunnel import drain, local_tunnels
from kernel import draining
from tests.fleet.tunnel.test_stream_batches import _send, _tunnel, _until
from tests.fleet.tunnel.test_tunnel_bad_input import _frame, node_identity  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


async def _closed(comm: WebsocketCommunicator, timeout: float = 5) -> dict[str, Any]:
    """The close the consumer sent (frames before it are skipped)."""
    while True:
        out = await comm.receive_output(timeout)
        if out["type"] == "websocket.close":
            return out


async def _settled(node_id: str, previous: Any = None) -> Any:
    """The node's tunnel consumer in this process once it is done saying hello (registered, in its groups,
    counted by the drain): the Welcome reaches the agent a moment before."""
    for _ in range(500):
        tunnel = local_tunnels.get(node_id)
        if tunnel is not None and tunnel is not previous and tunnel in drain._held:
            return tunnel
        await asyncio.sleep(0.01)
    raise AssertionError("the tunnel never settled")


async def _still_open(comm: WebsocketCommunicator, for_s: float = 0.5) -> bool:
    """No close came within `for_s` (frames that came are taken; a wait never cancels the consumer)."""
    deadline = asyncio.get_running_loop().time() + for_s
    while asyncio.get_running_loop().time() < deadline:
        if not await comm.receive_nothing(0.05):
            if (await comm.receive_output(1))["type"] == "websocket.close":
                return False
    return True


async def _stream_open(comm: WebsocketCommunicator) -> p.StreamOpen:
    """The next stream opening sent to the agent (from protocol 5 on inside a `StreamFrames`)."""
    while True:
        out = await comm.receive_output(5)
        assert out["type"] == "websocket.send", out
        frame = p.decode(out["text"] if out.get("text") is not None else out["bytes"])
        for entry in frame.frames if isinstance(frame, p.StreamFrames) else [frame]:
            if isinstance(entry, p.StreamOpen):
                return entry


@pytest.mark.asyncio
async def test_a_newer_tunnel_of_the_node_supersedes_the_older_one_which_closes_cleanly(node_identity):  # noqa: F811
    old, _ = await _tunnel(node_identity, "1-6")
    old_consumer = await _settled(node_identity.node_id)
    new, _ = await _tunnel(node_identity, "1-6")
    try:
        await _settled(node_identity.node_id, old_consumer)
        closed = await _closed(old)
        assert closed["code"] == 1000
        assert local_tunnels.get(node_identity.node_id) is not old_consumer  # new streams go to the new one
        assert await _still_open(new)
    finally:
        await new.disconnect()
        await old.disconnect()


@pytest.mark.asyncio
async def test_a_superseded_tunnel_closes_only_once_its_open_stream_ended(node_identity):  # noqa: F811
    old, _ = await _tunnel(node_identity, "1-6")
    await _settled(node_identity.node_id)
    stream = await TunnelStream.open(node_id=node_identity.node_id, port=8000, first_bytes=b"GET / HTTP/1.1\r\n\r\n")
    opened = await _stream_open(old)
    new, _ = await _tunnel(node_identity, "1-6")
    try:
        assert await _still_open(old, 1.0)  # its stream still runs on it
        await _send(old, p.StreamData(stream_id=opened.stream_id, data=b"HTTP/1.1 200 OK\r\n\r\nlast bytes"))
        await _send(old, p.StreamEnd(stream_id=opened.stream_id))
        assert b"last bytes" in await stream.read(timeout=5)
        closed = await _closed(old)
        assert closed["code"] == 1000
    finally:
        await new.disconnect()
        await old.disconnect()


@pytest.fixture
def drained():
    yield
    draining.reset()


@pytest.mark.asyncio
async def test_a_draining_process_asks_a_protocol_6_agent_to_move_and_keeps_its_tunnel(node_identity, drained):  # noqa: F811
    comm, version = await _tunnel(node_identity, "1-6")
    assert version == p.MOVE_SINCE
    try:
        await (await _settled(node_identity.node_id)).drain_move(2.5)
        move = await _until(comm, p.Move)
        assert move.within_s == 2.5
        assert await _still_open(comm)  # until its successor is welcomed
    finally:
        await comm.disconnect()


@pytest.mark.asyncio
async def test_a_draining_process_closes_an_older_agents_idle_tunnel_for_a_plain_reconnect(node_identity, drained):  # noqa: F811
    comm, version = await _tunnel(node_identity, "1-5")
    assert version == 5
    try:
        await (await _settled(node_identity.node_id)).drain_move(2.5)
        closed = await _closed(comm)
        assert closed["code"] == drain.CLOSE_SERVICE_RESTART
    finally:
        await comm.disconnect()


@pytest.mark.asyncio
async def test_a_draining_process_refuses_new_tunnels_with_a_short_backoff(drained):
    draining.begin(30.0)
    query = urlencode({"agent_nonce": "n0nce-0f-the-agent", "protocol": "1-6"})
    comm = WebsocketCommunicator(application, f"/agent/tunnel?{query}")
    connected, _ = await comm.connect()
    assert connected
    try:
        backoff = await _frame(comm)
        assert isinstance(backoff, p.Backoff)
        assert backoff.retry_after_s <= 1.0
        closed = await _closed(comm)
        assert closed["code"] == p.CLOSE_BACKOFF
    finally:
        await comm.disconnect()

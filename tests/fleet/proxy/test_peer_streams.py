"""`TunnelStream` over peer links: a request in one process, the node's tunnel held by another.

The holding process is this one's own peer listener (over real TCP) with a stand-in tunnel registered
in `local_tunnels`; the opening side is told the tunnel is not here (as in a process without it), so
every stream goes the peer way: node row → peer address → link → OPEN. A raw peer server written with
`peer_wire` plays a holding process that misbehaves (dies mid-stream, cannot prove the key).
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async

from agent.protocol import DEFAULT_STREAM_WINDOW
from fleet.models import Node
from fleet.proxy import peer_dialer, peer_routes, streams
from fleet.proxy.streams import StreamUnavailable, TunnelStream
from fleet.tunnel import local_tunnels, peer_listener, peer_wire
from tests.support.processes import free_port

pytestmark = pytest.mark.django_db(transaction=True)


class AgentStandIn:
    """A tunnel held by this process (what `open_local_stream` and `stream_message` meet in the consumer)."""

    def __init__(self) -> None:
        self.sinks: dict[int, Any] = {}
        self.openings: dict[int, dict[str, Any]] = {}
        self.received: list[dict[str, Any]] = []
        self._changed = asyncio.Event()

    async def node_command(self, message: dict[str, Any]) -> None:
        pass

    async def open_local_stream(self, stream: Any, opening: dict[str, Any]) -> None:
        self.sinks[stream.stream_id] = stream
        self.openings[stream.stream_id] = opening
        self._changed.set()

    async def stream_message(self, message: dict[str, Any]) -> None:
        self.received.append(message)
        self._changed.set()

    async def until(self, done: Callable[[], bool], timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while not done():
                self._changed.clear()
                await self._changed.wait()

    def sent(self, stream_id: int, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.received if m["stream_id"] == stream_id and m["type"] == kind]


@pytest.fixture
def not_held_here(monkeypatch):
    """The opening side sees no tunnel in its process and no listener of its own (another process)."""
    monkeypatch.setattr(streams, "local_tunnels", types.SimpleNamespace(get=lambda node_id: None))
    monkeypatch.setattr(streams, "peer_listener", types.SimpleNamespace(current_address=lambda: ""))
    peer_routes.forget_all()
    yield
    peer_routes.forget_all()


@pytest_asyncio.fixture
async def holder(node, not_held_here):
    """This process's listener holding `node`'s tunnel (a stand-in), recorded on the node row."""
    agent = AgentStandIn()
    local_tunnels.add(node.pk, agent)
    await _record_peer(node, await peer_listener.address())
    yield agent
    local_tunnels.discard(node.pk, agent)
    peer_dialer.links().close_all()
    peer_listener.stop()


async def _record_peer(node: Node, address: str) -> None:
    await sync_to_async(Node.objects.filter(pk=node.pk).update)(tunnel_peer=address, connected=True)


async def _read_all(stream: TunnelStream) -> bytes:
    got = b""
    while data := await stream.read(timeout=5):
        got += data
    return got


@pytest.mark.asyncio
async def test_many_streams_share_one_link_and_each_gets_its_bytes_in_order(node, holder):
    opened = await asyncio.gather(
        *(TunnelStream.open(node_id=node.pk, port=8000, first_bytes=b"GET /%d" % i, finished=True) for i in range(20))
    )
    assert len(peer_dialer.links()._links) == 1
    assert sorted(holder.openings) == sorted(s.stream_id for s in opened)
    assert {holder.openings[s.stream_id]["data"] for s in opened} == {b"GET /%d" % i for i in range(20)}
    assert all(holder.openings[s.stream_id]["end"] for s in opened)
    for token in range(30):  # interleaved: every stream's token n before any stream's token n + 1
        for stream in opened:
            holder.sinks[stream.stream_id].deliver({"type": "stream.data", "data": b"<%d>" % token})
    for stream in opened:
        holder.sinks[stream.stream_id].deliver({"type": "stream.end", "error": ""})
    bodies = await asyncio.gather(*(_read_all(stream) for stream in opened))
    assert bodies == [b"".join(b"<%d>" % t for t in range(30))] * 20
    assert all(stream.error == "" for stream in opened)
    for stream in opened:
        await stream.close()


@pytest.mark.asyncio
async def test_credit_flows_end_to_end_over_the_link(node, holder):
    stream = await TunnelStream.open(node_id=node.pk, port=8000, window=4096)
    await holder.until(lambda: stream.stream_id in holder.sinks)
    sink = holder.sinks[stream.stream_id]
    # request bytes: the agent's window, then nothing more until it returns credit
    body = bytes(range(256)) * (DEFAULT_STREAM_WINDOW // 256 + 8)
    writing = asyncio.ensure_future(stream.write(body))
    await holder.until(lambda: sum(len(m["data"]) for m in holder.sent(stream.stream_id, "stream.data")) >= 1)
    await asyncio.sleep(0.2)
    sent = b"".join(m["data"] for m in holder.sent(stream.stream_id, "stream.data"))
    assert len(sent) == DEFAULT_STREAM_WINDOW
    assert not writing.done()
    sink.deliver({"type": "stream.window", "increment": 4096})
    await asyncio.wait_for(writing, 5)
    await holder.until(lambda: sum(len(m["data"]) for m in holder.sent(stream.stream_id, "stream.data")) == len(body))
    assert b"".join(m["data"] for m in holder.sent(stream.stream_id, "stream.data")) == body
    # response bytes: credit goes back once a quarter of the window reached the client
    sink.deliver({"type": "stream.data", "data": b"x" * 1000})
    assert await stream.read(timeout=5) == b"x" * 1000
    await stream.consumed(1000)
    sink.deliver({"type": "stream.data", "data": b"y" * 100})
    assert await stream.read(timeout=5) == b"y" * 100
    await stream.consumed(100)
    await holder.until(lambda: holder.sent(stream.stream_id, "stream.window"))
    assert [m["increment"] for m in holder.sent(stream.stream_id, "stream.window")] == [1100]
    await stream.finish_writing()
    await holder.until(lambda: holder.sent(stream.stream_id, "stream.end"))
    assert holder.sent(stream.stream_id, "stream.end")[0]["error"] == ""
    await stream.close()
    await holder.until(lambda: len(holder.sent(stream.stream_id, "stream.end")) == 2)
    assert holder.sent(stream.stream_id, "stream.end")[1]["error"] == "closed by control plane"


@pytest.mark.asyncio
async def test_an_open_answered_not_here_asks_again_until_the_tunnel_is_back(node, holder):
    local_tunnels.discard(node.pk, holder)  # the agent is reconnecting: the row still names this process

    async def reconnect() -> None:
        await asyncio.sleep(0.5)
        local_tunnels.add(node.pk, holder)

    back = asyncio.ensure_future(reconnect())
    stream = await TunnelStream.open(node_id=node.pk, port=8000, grace_s=10)
    await back
    assert stream.stream_id in holder.openings
    await stream.close()


@pytest.mark.asyncio
async def test_a_stale_address_is_read_again_from_the_node_row(node, holder):
    listening = await peer_listener.address()
    await _record_peer(node, f"127.0.0.1:{free_port()}")  # a process that is gone

    async def moved() -> None:
        await asyncio.sleep(0.5)
        await _record_peer(node, listening)

    update = asyncio.ensure_future(moved())
    stream = await TunnelStream.open(node_id=node.pk, port=8000, grace_s=10)
    await update
    assert stream.stream_id in holder.openings
    await stream.close()


@pytest.mark.asyncio
async def test_without_the_tunnel_anywhere_the_open_gives_up_after_its_grace(node, holder):
    local_tunnels.discard(node.pk, holder)
    with pytest.raises(StreamUnavailable, match="not connected"):
        await TunnelStream.open(node_id=node.pk, port=8000, grace_s=0.5)
    await sync_to_async(Node.objects.filter(pk=node.pk).update)(tunnel_peer="", connected=False)
    with pytest.raises(StreamUnavailable, match="not connected"):
        await TunnelStream.open(node_id=node.pk, port=8000, grace_s=0.3)


async def _raw_peer(serve: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]) -> tuple[str, Any]:
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return f"127.0.0.1:{server.sockets[0].getsockname()[1]}", server


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, int, bytes]:
    kind, stream_id, size = peer_wire.HEADER.unpack(await reader.readexactly(peer_wire.HEADER.size))
    return kind, stream_id, await reader.readexactly(size)


@pytest.mark.asyncio
async def test_a_holding_process_that_dies_mid_stream_ends_the_stream_with_an_error(node, not_held_here):
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        key = peer_wire.link_key()
        _, _, hello = await _read_frame(reader)
        dialer_nonce, nonce = peer_wire.parse_hello(hello), peer_wire.new_nonce()
        writer.write(peer_wire.challenge_frame(key, dialer_nonce, nonce))
        _, _, proof = await _read_frame(reader)
        peer_wire.check_proof(key, dialer_nonce, nonce, proof)
        kind, stream_id, _ = await _read_frame(reader)
        assert kind == peer_wire.OPEN
        writer.write(
            peer_wire.frame(peer_wire.OPENED, stream_id) + peer_wire.frame(peer_wire.DATA, stream_id, b"HTTP/1.1 200")
        )
        await writer.drain()
        writer.transport.abort()  # the process dies

    address, server = await _raw_peer(serve)
    await _record_peer(node, address)
    try:
        stream = await TunnelStream.open(node_id=node.pk, port=8000)
        assert await stream.read(timeout=5) == b"HTTP/1.1 200"
        assert await stream.read(timeout=5) == b""
        assert "lost" in stream.error
        with pytest.raises(StreamUnavailable):
            await stream.write(b"x" * (DEFAULT_STREAM_WINDOW + 1))
        await stream.close()
    finally:
        server.close()
        peer_dialer.links().close_all()


@pytest.mark.asyncio
async def test_a_peer_that_cannot_prove_the_key_gets_no_stream(node, not_held_here):
    got_after_challenge: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, _, hello = await _read_frame(reader)
        writer.write(peer_wire.challenge_frame(b"another key" * 3, peer_wire.parse_hello(hello), peer_wire.new_nonce()))
        got_after_challenge.append(await reader.read())  # until the dialer hangs up
        writer.close()

    address, server = await _raw_peer(serve)
    await _record_peer(node, address)
    try:
        with pytest.raises(StreamUnavailable, match="could not reach the node's tunnel"):
            await TunnelStream.open(node_id=node.pk, port=8000, grace_s=0.5, first_bytes=b"secret request")
        await asyncio.sleep(0.1)
        assert got_after_challenge
        assert all(b"secret request" not in got for got in got_after_challenge)
    finally:
        server.close()
        peer_dialer.links().close_all()


def test_peer_links_work_on_uvloop_as_on_asyncio(node, not_held_here):
    """uvicorn runs the web processes on uvloop (whose transports are not asyncio's classes)."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> bytes:
        agent = AgentStandIn()
        local_tunnels.add(node.pk, agent)
        try:
            await _record_peer(node, await peer_listener.address())
            stream = await TunnelStream.open(node_id=node.pk, port=8000, first_bytes=b"GET /", finished=True)
            await agent.until(lambda: stream.stream_id in agent.sinks)
            agent.sinks[stream.stream_id].deliver({"type": "stream.data", "data": b"hello from the node"})
            agent.sinks[stream.stream_id].deliver({"type": "stream.end", "error": ""})
            return await _read_all(stream)
        finally:
            local_tunnels.discard(node.pk, agent)
            peer_dialer.links().close_all()
            peer_listener.stop()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(scenario()) == b"hello from the node"

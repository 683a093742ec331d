"""The holding side of peer links: streams another process opens to a tunnel of this process.

Driven through the real ASGI application (channels' WebsocketCommunicator plays the agent) over the real
Redis channel layer and PostgreSQL, as the other tunnel tests are; the other process is this test
dialing its own peer listener over real TCP (`tests.support.peer_streams`).
"""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async

from agent import protocol as p
from fleet.models import Node
from fleet.proxy import peer_dialer
from fleet.tunnel import peer_listener, peer_wire
from tests.fleet.tunnel.test_stream_batches import _send, _tunnel, _until
from tests.fleet.tunnel.test_tunnel_bad_input import node_identity  # noqa: F401
from tests.support.peer_streams import open_over_link

pytestmark = pytest.mark.django_db(transaction=True)


@pytest_asyncio.fixture(autouse=True)
async def peers():
    """Every link and the listener of the test's loop are gone after it."""
    yield
    peer_dialer.links().close_all()
    peer_listener.stop()


async def _tunnel_peer(node_id: str) -> str:
    return await sync_to_async(lambda: Node.objects.get(pk=node_id).tunnel_peer)()


@pytest.mark.asyncio
async def test_a_tunnel_records_where_other_processes_reach_it_and_clears_it_when_it_closes(node_identity):  # noqa: F811
    comm, _ = await _tunnel(node_identity, "1-3")
    address = await peer_listener.address()
    host, port = peer_wire.parse_address(address)
    assert (host, port > 0) == ("127.0.0.1", True)
    assert await _tunnel_peer(node_identity.node_id) == address
    # the consumer's disconnect clears it; the communicator's default 1 s would cancel that work on a busy machine
    await comm.disconnect(timeout=15)
    assert await _tunnel_peer(node_identity.node_id) == ""


@pytest.mark.asyncio
@pytest.mark.parametrize("host", ["train-1a2b3c4d-head-svc.cleverthis-workloads.svc", ""])
async def test_an_open_over_a_peer_link_reaches_the_agent_with_its_host_and_first_bytes(node_identity, host):  # noqa: F811
    comm, _ = await _tunnel(node_identity, "1-3")
    _, _, opened = await open_over_link(
        node_identity.node_id, 41, port=8265, host=host, window=4096, data=b"GET / HTTP/1.1\r\n\r\n"
    )
    assert opened
    frame = await _until(comm, p.StreamOpen)
    assert (frame.stream_id, frame.port, frame.window, frame.host) == (41, 8265, 4096, host)
    first = await _until(comm, p.StreamData)
    assert (first.stream_id, first.payload()) == (41, b"GET / HTTP/1.1\r\n\r\n")
    await comm.disconnect()


@pytest.mark.asyncio
async def test_what_the_opener_sends_reaches_the_agent_in_order(node_identity):  # noqa: F811
    comm, _ = await _tunnel(node_identity, "1-3")
    link, _, _ = await open_over_link(node_identity.node_id, 42)
    await _until(comm, p.StreamOpen)
    for part in (b"one ", b"two ", b"three"):
        link.send(peer_wire.frame(peer_wire.DATA, 42, part))
    link.send(peer_wire.window_frame(42, 1000))
    link.send(peer_wire.end_frame(42))
    frames = [await _until(comm, p.StreamData) for _ in range(3)]
    assert [f.payload() for f in frames] == [b"one ", b"two ", b"three"]
    window = await _until(comm, p.StreamWindow)
    assert (window.stream_id, window.increment) == (42, 1000)
    end = await _until(comm, p.StreamEnd)
    assert (end.stream_id, end.error) == (42, "")
    await comm.disconnect()


@pytest.mark.asyncio
async def test_the_agents_answer_goes_back_over_the_link(node_identity):  # noqa: F811
    comm, _ = await _tunnel(node_identity, "1-3")
    _, collector, _ = await open_over_link(node_identity.node_id, 43)
    await _until(comm, p.StreamOpen)
    await _send(comm, p.StreamBatch(chunks=[(43, b"a"), (5, b"not ours"), (43, b"b")], v=3))
    await _send(comm, p.StreamWindow(stream_id=43, increment=512, v=3))
    await _send(comm, p.StreamData(stream_id=43, data=b"c", v=3))
    await _send(comm, p.StreamEnd(stream_id=43, v=3))
    await collector.until(lambda c: c.ended() is not None)
    assert [m["type"] for m in collector.messages] == [
        "stream.data",
        "stream.data",
        "stream.window",
        "stream.data",
        "stream.end",
    ]
    assert collector.data() == b"abc"
    assert collector.messages[2]["increment"] == 512
    assert collector.ended() == {"type": "stream.end", "error": ""}
    await comm.disconnect()


@pytest.mark.asyncio
async def test_an_open_for_a_tunnel_this_process_does_not_hold_is_answered_not_here(node_identity):  # noqa: F811
    _, collector, opened = await open_over_link("00000000-0000-4000-8000-000000000001", 44)
    assert opened is False
    assert collector.messages == []


@pytest.mark.asyncio
async def test_an_open_sent_twice_opens_the_stream_at_the_agent_once(node_identity):  # noqa: F811
    comm, _ = await _tunnel(node_identity, "1-3")
    link, _, _ = await open_over_link(node_identity.node_id, 45)
    assert (await _until(comm, p.StreamOpen)).stream_id == 45
    link.send(peer_wire.open_frame(45, peer_wire.Opening(node_identity.node_id, 8000, "", 4096, b"", False)))
    await _send(comm, p.Heartbeat(cpu_percent=1.0, memory_percent=2.0))
    later = []
    while not isinstance(frame := await _until(comm, p.Frame), p.HeartbeatAck):
        later.append(frame)
    assert [f for f in later if isinstance(f, p.StreamOpen)] == []
    await comm.disconnect()


@pytest.mark.asyncio
async def test_a_closing_tunnel_ends_the_streams_opened_over_links_with_an_error(node_identity):  # noqa: F811
    comm, _ = await _tunnel(node_identity, "1-3")
    _, collector, _ = await open_over_link(node_identity.node_id, 46)
    await _until(comm, p.StreamOpen)
    await comm.disconnect()
    await collector.until(lambda c: c.ended() is not None)
    assert collector.ended()["error"] == "tunnel closed"


@pytest.mark.asyncio
async def test_a_link_that_drops_ends_its_streams_at_the_agent(node_identity):  # noqa: F811
    comm, _ = await _tunnel(node_identity, "1-3")
    link, _, _ = await open_over_link(node_identity.node_id, 47)
    await _until(comm, p.StreamOpen)
    link._lose("the opening process died")
    end = await _until(comm, p.StreamEnd)
    assert end.stream_id == 47
    assert end.error.startswith("peer link lost")
    # the tunnel itself lives on
    await _send(comm, p.Heartbeat(cpu_percent=1.0, memory_percent=2.0))
    assert isinstance(await _until(comm, p.HeartbeatAck), p.HeartbeatAck)
    await comm.disconnect()


@pytest.mark.asyncio
async def test_a_dialer_without_the_key_is_dropped_before_anything_is_served(node_identity):  # noqa: F811
    comm, _ = await _tunnel(node_identity, "1-3")
    host, port = peer_wire.parse_address(await peer_listener.address())
    reader, writer = await asyncio.open_connection(host, port)
    nonce = peer_wire.new_nonce()
    writer.write(peer_wire.hello_frame(nonce))
    head = await reader.readexactly(peer_wire.HEADER.size)
    kind, _, size = peer_wire.HEADER.unpack(head)
    listener_nonce = peer_wire.check_challenge(peer_wire.link_key(), nonce, await reader.readexactly(size))
    assert kind == peer_wire.CHALLENGE
    wrong_key = b"k" * 32
    writer.write(peer_wire.proof_frame(wrong_key, nonce, listener_nonce))
    writer.write(peer_wire.open_frame(48, peer_wire.Opening(node_identity.node_id, 8000, "", 4096, b"", False)))
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, no OPENED
    writer.close()
    await _send(comm, p.Heartbeat(cpu_percent=1.0, memory_percent=2.0))
    later = []
    while not isinstance(frame := await _until(comm, p.Frame), p.HeartbeatAck):
        later.append(frame)
    assert [f for f in later if isinstance(f, p.StreamOpen)] == []
    await comm.disconnect()

"""Protocol 3 on the control plane: several streams' data in one tunnel message, protocol-2 agents, and
heartbeats that neither wait behind nor hold up stream data.

Driven through the real ASGI application with channels' WebsocketCommunicator over the real Redis
channel layer and PostgreSQL, as the other tunnel tests are. The streams are real `TunnelStream`s: on
the process holding the tunnel (in memory) and from another process (over a peer link).
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlencode

import pytest
from channels.testing import WebsocketCommunicator

from agent import protocol as p
from cleverthis.asgi import application
from fleet.proxy import peer_dialer
from fleet.proxy.streams import TunnelStream
from fleet.tunnel import peer_listener
from fleet.tunnel import records as tunnel_records
from fleet.tunnel.batching import Coalescer
from fleet.tunnel.server_io import HeartbeatFirst
from tests.fleet.tunnel.test_tunnel_bad_input import Identity, _hello, node_identity  # noqa: F401
from tests.support.peer_streams import open_over_link

pytestmark = pytest.mark.django_db(transaction=True)


async def _frame(comm: WebsocketCommunicator, timeout: float = 5) -> p.Frame:
    """The next frame the control plane sent (text or binary)."""
    message = await comm.receive_output(timeout)
    assert message["type"] == "websocket.send", message
    return p.decode(message["text"] if message.get("text") is not None else message["bytes"])


async def _tunnel(ident: Identity, protocol: str) -> tuple[WebsocketCommunicator, int]:
    """An authenticated tunnel of an agent that states `protocol` (e.g. "1-3"); (socket, its version)."""
    query = urlencode({"agent_nonce": "n0nce-0f-the-agent", "protocol": protocol})
    comm = WebsocketCommunicator(application, f"/agent/tunnel?{query}")
    connected, _ = await comm.connect()
    assert connected
    challenge = await _frame(comm)
    assert isinstance(challenge, p.Challenge)
    await comm.send_to(text_data=p.encode(_hello(ident, challenge)))
    welcome = await _frame(comm)
    assert isinstance(welcome, p.Welcome), welcome
    return comm, challenge.v


async def _until(comm: WebsocketCommunicator, kind: type[p.Frame]) -> Any:
    while True:
        frame = await _frame(comm)
        if isinstance(frame, kind):
            return frame


async def _send(comm: WebsocketCommunicator, frame: p.Frame) -> None:
    raw = p.encode(frame)
    await (comm.send_to(bytes_data=raw) if isinstance(raw, bytes) else comm.send_to(text_data=raw))


async def _read_all(stream: TunnelStream, size: int) -> bytes:
    got = b""
    while len(got) < size:
        data = await stream.read(timeout=10)
        assert data, f"stream ended after {got!r}"
        got += data
    return got


async def _local_streams(ident: Identity, comm: WebsocketCommunicator, count: int) -> list[TunnelStream]:
    """`count` streams opened from this process (the tunnel's replica): in memory, no Redis."""
    streams = []
    for _ in range(count):
        stream = await TunnelStream.open(node_id=ident.node_id, port=8000, first_bytes=b"GET / HTTP/1.1\r\n\r\n")
        opened = await _until(comm, p.StreamOpen)
        assert opened.stream_id == stream.stream_id
        streams.append(stream)
    return streams


@pytest.mark.asyncio
@pytest.mark.parametrize(("agent_range", "version"), [("1-3", 3), ("1-2", 2), ("2-3", 3)])
async def test_the_tunnel_speaks_the_highest_version_both_sides_know(node_identity, agent_range, version):  # noqa: F811
    comm, spoken = await _tunnel(node_identity, agent_range)
    assert spoken == version
    await comm.disconnect()


@pytest.mark.asyncio
async def test_interleaved_streams_in_batches_reach_each_stream_in_order(node_identity):  # noqa: F811
    comm, version = await _tunnel(node_identity, "1-3")
    assert version == 3
    one, two = await _local_streams(node_identity, comm, 2)
    expected: dict[int, bytes] = {one.stream_id: b"", two.stream_id: b""}
    for batch in range(3):  # order within a batch and across batches, the two streams interleaved
        chunks = []
        for token in range(5):
            for stream in (one, two) if token % 2 else (two, one):
                data = f"<{stream.stream_id % 1000}:{batch}.{token}>".encode()
                chunks.append((stream.stream_id, data))
                expected[stream.stream_id] += data
        await _send(comm, p.StreamBatch(chunks=chunks, v=3))
    # a plain StreamData still works beside batches, and the stream's end comes after its data
    await _send(comm, p.StreamData(stream_id=one.stream_id, data=b"<last>", v=3))
    expected[one.stream_id] += b"<last>"
    await _send(comm, p.StreamEnd(stream_id=one.stream_id, v=3))
    assert await _read_all(one, len(expected[one.stream_id])) == expected[one.stream_id]
    assert await one.read(timeout=10) == b""  # the end, after all the data
    assert await _read_all(two, len(expected[two.stream_id])) == expected[two.stream_id]
    for stream in (one, two):
        await stream.close()
    await comm.disconnect()


@pytest.mark.asyncio
async def test_a_batch_reaches_a_stream_opened_by_another_process_in_order(node_identity):  # noqa: F811
    comm, _ = await _tunnel(node_identity, "1-3")
    _, collector, _ = await open_over_link(node_identity.node_id, 77)
    await _until(comm, p.StreamOpen)
    await _send(comm, p.StreamBatch(chunks=[(77, b"a"), (5, b"not ours"), (77, b"b")], v=3))
    await _send(comm, p.StreamBatch(chunks=[(77, b"c")], v=3))
    await collector.until(lambda c: c.data() == b"abc")
    peer_dialer.links().close_all()
    peer_listener.stop()
    await comm.disconnect()


@pytest.mark.asyncio
async def test_a_protocol_2_agent_keeps_its_per_stream_frames(node_identity):  # noqa: F811
    comm, version = await _tunnel(node_identity, "1-2")
    assert version == 2
    (stream,) = await _local_streams(node_identity, comm, 1)
    for token in range(3):
        await _send(comm, p.StreamData(stream_id=stream.stream_id, data=f"t{token} ".encode(), v=2))
    assert await _read_all(stream, 9) == b"t0 t1 t2 "
    # what the control plane sends down this tunnel is at version 2: no batches, the old encodings
    await stream.write(b"more request bytes")
    sent = [await _until(comm, p.StreamData)]  # the request's first bytes (with the open), then these
    while sent[-1].payload() != b"more request bytes":
        sent.append(await _until(comm, p.StreamData))
    assert {frame.v for frame in sent} == {2}
    await stream.close()
    await comm.disconnect()


@pytest.mark.asyncio
async def test_stream_data_is_delivered_while_a_heartbeat_waits_for_its_database_write(
    node_identity,  # noqa: F811
    monkeypatch,
):
    release = asyncio.Event()
    written: list[Any] = []

    async def slow_write(beats: list[Any]) -> list[bool]:
        await release.wait()
        written.extend(beats)
        return [False for _ in beats]

    monkeypatch.setattr(tunnel_records, "HEARTBEATS", Coalescer(slow_write))
    comm, _ = await _tunnel(node_identity, "1-3")
    (stream,) = await _local_streams(node_identity, comm, 1)
    beat = p.Heartbeat(cpu_percent=1.0, memory_percent=1.0)
    await _send(comm, beat)
    await _send(comm, p.StreamBatch(chunks=[(stream.stream_id, b"after the heartbeat")], v=3))
    # the data arrives although the heartbeat's write has not finished
    assert await _read_all(stream, 19) == b"after the heartbeat"
    assert written == []
    release.set()
    ack = await _until(comm, p.HeartbeatAck)
    assert ack.heartbeat_id == beat.id
    assert len(written) == 1
    await stream.close()
    await comm.disconnect()


def _receive(text: str | None = None, data: bytes | None = None) -> dict[str, Any]:
    if text is not None:
        return {"type": "websocket.receive", "text": text}
    return {"type": "websocket.receive", "bytes": data}


@pytest.mark.asyncio
async def test_a_heartbeat_queued_behind_a_backlog_of_stream_data_is_handed_out_first():
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    backlog = [_receive(data=p.encode(p.StreamData.of(i % 7, bytes([i % 256])))) for i in range(500)]
    end = _receive(text=p.encode(p.StreamEnd(stream_id=3)))
    beat = _receive(text=p.encode(p.Heartbeat(cpu_percent=1.0, memory_percent=1.0)))
    ack = _receive(text=p.encode(p.Ack(command_id="c1")))
    # a frame that merely carries such a value is not a heartbeat and keeps its place
    progress = _receive(text=p.encode(p.Progress(command_id="c1", message="m", data={"type": "heartbeat"})))
    for message in [*backlog, end, ack, progress, beat]:
        queue.put_nowait(message)
    receive = HeartbeatFirst.over(queue.get)  # as daphne passes it: its queue's `get`, read without bound
    assert receive is not None
    assert await receive() is beat
    rest = [await receive() for _ in range(len(backlog) + 3)]
    assert rest == [*backlog, end, ack, progress]  # the rest in arrival order: no end overtakes its data
    # and with nothing queued it simply waits for the next message
    waiting = asyncio.ensure_future(receive())
    await asyncio.sleep(0)
    assert not waiting.done()
    queue.put_nowait(ack)
    assert await waiting is ack


class _PausingSocket:
    """Stands for uvicorn's WebSocket protocol: a `queue` and a `receive` that resumes reading the socket
    once the queue is empty; what the socket still holds is delivered one read (`chunk` messages) at a time."""

    def __init__(self, messages: list[dict[str, Any]], chunk: int) -> None:
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.unread = list(messages)
        self.chunk = chunk
        self.reads = 0
        self._read()

    def _read(self) -> None:
        batch, self.unread = self.unread[: self.chunk], self.unread[self.chunk :]
        self.reads += 1
        for message in batch:
            self.queue.put_nowait(message)

    async def receive(self) -> dict[str, Any]:
        message = await self.queue.get()
        if self.queue.empty() and self.unread:
            self._read()
        return message


@pytest.mark.asyncio
async def test_under_uvicorn_a_heartbeat_behind_several_reads_of_stream_data_is_handed_out_first():
    """uvicorn stops reading while its queue holds messages and reads on once `receive` emptied it: the
    backlog still reaches `HeartbeatFirst`, and the heartbeat overtakes the stream data read before it."""
    data = [_receive(data=p.encode(p.StreamData.of(1, bytes([i % 256])))) for i in range(200)]
    beat = _receive(text=p.encode(p.Heartbeat(cpu_percent=1.0, memory_percent=1.0)))
    socket = _PausingSocket([*data[:150], beat, *data[150:]], chunk=4)
    receive = HeartbeatFirst.over(socket.receive)
    assert receive is not None
    assert await receive() is beat
    assert socket.reads > 150 // socket.chunk  # it took many reads of the socket to get there
    rest = [await receive() for _ in range(len(data))]
    assert rest == data  # stream data in arrival order

"""The agent's FrameSender: control frames first, a stream's normal end stays behind its data, and from
protocol 3 on the data of several streams that is ready together goes out as one `StreamBatch`."""

from __future__ import annotations

import asyncio

import pytest

from agent import protocol as p
from agent.transport.tunnel import FrameSender, SessionEnded


class Socket:
    """Records what the sender hands to the WebSocket, decoded."""

    def __init__(self) -> None:
        self.sent: list[p.Frame] = []
        self.raw: list[str | bytes] = []

    async def send(self, raw: str | bytes) -> None:
        self.raw.append(raw)
        self.sent.append(p.decode(raw))


def _drain(sender: FrameSender) -> list[p.Frame]:
    """Everything queued, as the sender would put it on the socket, in order."""
    out = []
    while (message := sender.next_message()) is not None:
        out.append(p.decode(message))
    return out


def _chunks(frames: list[p.Frame]) -> list[tuple[int, bytes]]:
    """The stream chunks carried by `frames` (StreamData and StreamBatch), in wire order."""
    chunks: list[tuple[int, bytes]] = []
    for frame in frames:
        if isinstance(frame, p.StreamBatch):
            chunks.extend((stream_id, bytes(data)) for stream_id, data in frame.chunks)
        elif isinstance(frame, p.StreamData):
            chunks.append((frame.stream_id, frame.payload()))
    return chunks


def test_a_streams_normal_end_never_overtakes_its_queued_data_but_control_frames_and_aborts_do():
    async def scenario() -> list[p.Frame]:
        socket = Socket()
        sender = FrameSender(socket, version=2)  # one frame per chunk: each is checked on its own
        for i in range(3):
            sender.send(p.StreamData.of(7, bytes([i]) * 10))
        sender.send(p.StreamEnd(stream_id=7))
        sender.send(p.Heartbeat(cpu_percent=1.0, memory_percent=1.0))
        sender.send(p.StreamEnd(stream_id=9, error="aborted"))
        writer = asyncio.ensure_future(sender.run())
        while len(socket.sent) < 6:
            await asyncio.sleep(0.01)
        writer.cancel()
        return socket.sent

    sent = asyncio.run(scenario())
    assert [type(f).__name__ for f in sent[:2]] == ["Heartbeat", "StreamEnd"]
    assert sent[1].stream_id == 9
    assert [type(f).__name__ for f in sent[2:]] == ["StreamData", "StreamData", "StreamData", "StreamEnd"]
    assert [f.payload()[0] for f in sent[2:5]] == [0, 1, 2]


def test_data_of_several_streams_ready_together_goes_out_as_one_batch_in_order():
    sender = FrameSender(Socket(), version=3)
    for i in range(4):
        for stream_id in (1, 2, 3):
            sender.send(p.StreamData.of(stream_id, f"s{stream_id}t{i}".encode()))
    frames = _drain(sender)
    assert len(frames) == 1
    (batch,) = frames
    assert isinstance(batch, p.StreamBatch)
    assert batch.v == 3
    assert [(sid, bytes(data)) for sid, data in batch.chunks] == [
        (stream_id, f"s{stream_id}t{i}".encode()) for i in range(4) for stream_id in (1, 2, 3)
    ]


def test_a_lone_chunk_goes_out_as_plain_stream_data_at_once():
    async def scenario() -> list[str | bytes]:
        socket = Socket()
        sender = FrameSender(socket, version=3)
        writer = asyncio.ensure_future(sender.run())
        sender.send(p.StreamData.of(5, b"token"))
        while not socket.sent:  # no timer: the sender puts it on the socket as soon as it runs
            await asyncio.sleep(0)
        writer.cancel()
        return socket.raw

    (raw,) = asyncio.run(scenario())
    frame = p.decode(raw)
    assert isinstance(frame, p.StreamData)
    assert (frame.stream_id, frame.payload(), frame.v) == (5, b"token", 3)


def test_a_protocol_2_peer_gets_one_stream_data_frame_per_chunk():
    sender = FrameSender(Socket(), version=2)
    for i in range(5):
        sender.send(p.StreamData.of(i % 2, bytes([i])))
    frames = _drain(sender)
    assert [type(f) for f in frames] == [p.StreamData] * 5
    assert {f.v for f in frames} == {2}
    assert _chunks(frames) == [(i % 2, bytes([i])) for i in range(5)]


def test_batches_are_bounded_and_keep_each_streams_order_across_batches():
    sender = FrameSender(Socket(), version=3)
    piece = 10 * 1024
    sent = []
    for i in range(100):  # ~1 MB of chunks on 3 interleaved streams: several batches
        stream_id = i % 3
        data = bytes([i]) * piece
        sent.append((stream_id, data))
        sender.send(p.StreamData.of(stream_id, data))
    raws = []
    while (message := sender.next_message()) is not None:
        raws.append(message)
    frames = [p.decode(raw) for raw in raws]
    assert len(frames) > 1
    assert all(len(raw) <= p.STREAM_BATCH_MAX_BYTES + 2 for raw in raws)
    assert _chunks(frames) == sent
    for stream_id in range(3):
        assert [data for sid, data in _chunks(frames) if sid == stream_id] == [
            data for sid, data in sent if sid == stream_id
        ]


def test_a_chunk_larger_than_a_batch_goes_alone_and_a_normal_end_cuts_the_batch():
    sender = FrameSender(Socket(), version=3)
    big = b"x" * p.STREAM_BATCH_MAX_BYTES
    sender.send(p.StreamData.of(1, b"a"))
    sender.send(p.StreamData.of(2, b"b"))
    sender.send(p.StreamEnd(stream_id=1))
    sender.send(p.StreamData.of(2, b"c"))
    sender.send(p.StreamData.of(2, big))
    frames = _drain(sender)
    assert [type(f) for f in frames] == [p.StreamBatch, p.StreamEnd, p.StreamData, p.StreamData]
    assert _chunks(frames) == [(1, b"a"), (2, b"b"), (2, b"c"), (2, big)]


def test_a_heartbeat_queued_behind_a_lot_of_stream_data_is_sent_first():
    async def scenario() -> list[p.Frame]:
        socket = Socket()
        sender = FrameSender(socket, version=3)
        for i in range(2000):  # a backlog of tokens on 200 streams: several batches' worth
            sender.send(p.StreamData.of(i % 200, b"data: " + b"x" * 200 + b"\n\n"))
        beat = p.Heartbeat(cpu_percent=1.0, memory_percent=1.0)
        sender.send(beat)
        writer = asyncio.ensure_future(sender.run())
        while len(_chunks(socket.sent)) < 2000:
            await asyncio.sleep(0.01)
        writer.cancel()
        return socket.sent

    sent = asyncio.run(scenario())
    assert isinstance(sent[0], p.Heartbeat)
    assert len(sent) > 2  # the data itself went in more than one message
    assert len(_chunks(sent)) == 2000


def test_the_agent_hands_each_chunk_of_a_batch_from_the_control_plane_to_its_stream_in_order(tmp_path):
    from websockets.exceptions import ConnectionClosedOK

    from tests.agent.transport.test_close_reasons import _client

    class Streams:
        def __init__(self) -> None:
            self.handled: list[tuple[int, bytes]] = []

        def handle(self, frame: p.Frame) -> None:
            assert isinstance(frame, p.StreamData)
            self.handled.append((frame.stream_id, frame.payload()))

    class Incoming:
        def __init__(self, raws: list[bytes]) -> None:
            self.raws = raws

        async def recv(self) -> bytes:
            if not self.raws:
                raise ConnectionClosedOK(None, None)
            return self.raws.pop(0)

    chunks = [(1, b"a"), (2, b"x"), (1, b"b"), (2, b"y")]
    raws = [p.encode_batch(chunks[:3], 3), p.encode(p.StreamData(stream_id=2, data=b"y", v=3))]
    streams = Streams()
    client = _client(tmp_path, 9)
    with pytest.raises(SessionEnded):  # after the frames, the socket closes: the session ends
        asyncio.run(client._receive_loop(Incoming(raws), streams))  # type: ignore[arg-type]
    assert streams.handled == chunks

"""The agent's FrameSender: control frames first, a stream's normal end stays behind its data, from
protocol 3 on the data of several streams that is ready together goes out as one `StreamBatch`, and from
protocol 5 on streams' windows and ends go out together too (`StreamFrames`)."""

from __future__ import annotations

import asyncio

import pytest

from agent import protocol as p
from agent.transport.sender import FrameSender
from agent.transport.tunnel import SessionEnded


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
        elif isinstance(frame, p.StreamFrames):
            chunks.extend(_chunks(frame.frames))  # type: ignore[arg-type]
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


def _entries(frames: list[p.Frame]) -> list[p.Frame]:
    """`frames` with every `StreamFrames` opened up into its entries, in wire order."""
    out: list[p.Frame] = []
    for frame in frames:
        out.extend(frame.frames if isinstance(frame, p.StreamFrames) else [frame])
    return out


def _shape(frames: list[p.Frame]) -> list[tuple[str, int, object]]:
    """(type, stream id, what it carries) of each stream frame: comparable across encodings."""
    shape = []
    for frame in _entries(frames):
        if isinstance(frame, p.StreamData):
            shape.append(("data", frame.stream_id, frame.payload()))
        elif isinstance(frame, p.StreamWindow):
            shape.append(("window", frame.stream_id, frame.increment))
        elif isinstance(frame, p.StreamEnd):
            shape.append(("end", frame.stream_id, frame.error))
        else:
            shape.append((frame.TYPE, 0, None))
    return shape


def _queue_a_burst(sender: FrameSender) -> None:
    """What 3 streams' answers and credit returns look like when they are ready in the same turn."""
    for stream_id in (1, 2, 3):
        sender.send(p.StreamData.of(stream_id, f"answer {stream_id}".encode()))
        sender.send(p.StreamWindow(stream_id=stream_id, increment=100))
        sender.send(p.StreamEnd(stream_id=stream_id))
    sender.send(p.StreamEnd(stream_id=4, error="cannot connect to port 1"))


def test_from_protocol_5_windows_and_ends_go_out_together_with_the_data_around_them():
    sender = FrameSender(Socket(), version=5)
    _queue_a_burst(sender)
    frames = _drain(sender)
    # two messages: the control line (windows and the abort) first, then the data with the normal ends
    assert [type(f) for f in frames] == [p.StreamFrames, p.StreamFrames]
    assert {f.v for f in frames} == {5}
    assert _shape(frames) == [
        ("window", 1, 100),
        ("window", 2, 100),
        ("window", 3, 100),
        ("end", 4, "cannot connect to port 1"),
        ("data", 1, b"answer 1"),
        ("end", 1, ""),
        ("data", 2, b"answer 2"),
        ("end", 2, ""),
        ("data", 3, b"answer 3"),
        ("end", 3, ""),
    ]


def test_a_protocol_4_peer_gets_the_same_frames_one_message_each_but_for_batched_data():
    sender = FrameSender(Socket(), version=4)
    _queue_a_burst(sender)
    frames = _drain(sender)
    assert not any(isinstance(f, p.StreamFrames) for f in frames)
    assert {f.v for f in frames} == {4}
    # the same frames, each stream's in the same order (a normal end still cuts a data batch at 4)
    v5 = FrameSender(Socket(), version=5)
    _queue_a_burst(v5)
    assert _shape(frames) == _shape(_drain(v5))
    assert len(frames) == 3 + 1 + 3 * 2


def test_from_protocol_5_a_control_frame_between_windows_keeps_its_place():
    sender = FrameSender(Socket(), version=5)
    sender.send(p.StreamWindow(stream_id=1, increment=1))
    beat = p.Heartbeat(cpu_percent=1.0, memory_percent=1.0)
    sender.send(beat)
    sender.send(p.StreamWindow(stream_id=2, increment=2))
    sender.send(p.StreamWindow(stream_id=3, increment=3))
    frames = _drain(sender)
    assert [type(f) for f in frames] == [p.StreamWindow, p.Heartbeat, p.StreamFrames]
    assert _shape(frames) == [("window", 1, 1), ("heartbeat", 0, None), ("window", 2, 2), ("window", 3, 3)]


def test_from_protocol_5_data_alone_still_goes_out_as_a_stream_batch_and_mixed_runs_are_bounded():
    sender = FrameSender(Socket(), version=5)
    for stream_id in (1, 2):
        sender.send(p.StreamData.of(stream_id, b"token"))
    assert [type(f) for f in _drain(sender)] == [p.StreamBatch]
    piece = 10 * 1024
    sent = []
    for i in range(100):  # ~1 MB with an end after every tenth chunk: several bounded messages
        sender.send(p.StreamData.of(i % 3, bytes([i]) * piece))
        sent.append(("data", i % 3, bytes([i]) * piece))
        if i % 10 == 9:
            sender.send(p.StreamEnd(stream_id=i % 3))
            sent.append(("end", i % 3, ""))
    raws = []
    while (message := sender.next_message()) is not None:
        raws.append(message)
    assert len(raws) > 1
    assert all(len(raw) <= p.STREAM_BATCH_MAX_BYTES + 2 for raw in raws)
    assert _shape([p.decode(raw) for raw in raws]) == sent


def test_the_agent_dispatches_each_entry_of_stream_frames_from_the_control_plane_in_order(tmp_path):
    from websockets.exceptions import ConnectionClosedOK

    from tests.agent.transport.test_close_reasons import _client

    class Streams:
        def __init__(self) -> None:
            self.handled: list[p.Frame] = []

        def handle(self, frame: p.Frame) -> None:
            self.handled.append(frame)

    class Incoming:
        def __init__(self, raws: list[bytes]) -> None:
            self.raws = raws

        async def recv(self) -> bytes:
            if not self.raws:
                raise ConnectionClosedOK(None, None)
            return self.raws.pop(0)

    entries: list[p.StreamFrame] = [
        p.StreamOpen(stream_id=1, port=8000, id="", v=5),
        p.StreamData(stream_id=1, data=b"GET /", v=5),
        p.StreamEnd(stream_id=1, id="", v=5),
        p.StreamOpen(stream_id=2, port=8000, id="", v=5),
        p.StreamWindow(stream_id=3, increment=7, id="", v=5),
    ]
    streams = Streams()
    client = _client(tmp_path, 9)
    with pytest.raises(SessionEnded):  # after the frames, the socket closes: the session ends
        asyncio.run(client._receive_loop(Incoming([p.encode_stream_frames(entries, 5)]), streams))  # type: ignore[arg-type]
    assert streams.handled == entries

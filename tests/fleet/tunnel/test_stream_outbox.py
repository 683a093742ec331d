"""Protocol 5 on the control plane: a tunnel's stream frames towards its agent coalesced per event-loop turn.

`StreamOutbox` on its own (bounds, order, the fallback for values the binary layout cannot hold), then
the real tunnel consumer driven through the ASGI application with channels' WebsocketCommunicator over
the real Redis channel layer and PostgreSQL: many streams opened in one turn reach a protocol-5 agent as
one message and a protocol-4 agent as today's separate frames; the agent's `StreamFrames` reach each
stream in order; a failing writer closes the tunnel with a logged reason.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator

from agent import protocol as p
from fleet.proxy.streams import TunnelStream
from fleet.tunnel.consumer import AgentTunnelConsumer
from fleet.tunnel.outbox import StreamOutbox
from tests.fleet.tunnel.test_stream_batches import _read_all, _send, _tunnel
from tests.fleet.tunnel.test_tunnel_bad_input import node_identity  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


async def _nothing(raw: str | bytes) -> None:
    """A socket that takes anything (for outboxes driven with `next_message`)."""


def _messages(outbox: StreamOutbox) -> list[str | bytes]:
    out = []
    while (message := outbox.next_message()) is not None:
        out.append(message)
    return out


def _entries(frames: list[p.Frame]) -> list[p.Frame]:
    """`frames` with every `StreamFrames` opened up into its entries, in wire order."""
    out: list[p.Frame] = []
    for frame in frames:
        out.extend(frame.frames if isinstance(frame, p.StreamFrames) else [frame])
    return out


def _opening(stream_id: int) -> list[p.StreamFrame]:
    return [
        p.StreamOpen(stream_id=stream_id, port=8000, id=""),
        p.StreamData(stream_id=stream_id, data=f"GET /{stream_id} HTTP/1.1\r\n\r\n".encode()),
        p.StreamEnd(stream_id=stream_id, id=""),
    ]


@pytest.mark.asyncio
async def test_the_outbox_puts_what_was_queued_together_in_one_message_in_order():
    outbox = StreamOutbox(_nothing, p.PROTOCOL_VERSION)
    queued = [frame for stream_id in range(1, 101) for frame in _opening(stream_id)]
    for frame in queued:
        outbox.put(frame)
    (message,) = _messages(outbox)
    batch = p.decode(message)
    assert isinstance(batch, p.StreamFrames)
    assert batch.frames == queued  # (made without ids, at protocol 5: as the wire carries them)


@pytest.mark.asyncio
async def test_the_outbox_sends_a_lone_frame_as_itself_and_bounds_its_messages():
    outbox = StreamOutbox(_nothing, p.PROTOCOL_VERSION)
    outbox.put(p.StreamWindow(stream_id=1, increment=5))
    (lone,) = [p.decode(m) for m in _messages(outbox)]
    assert isinstance(lone, p.StreamWindow)
    big = b"x" * (p.STREAM_BATCH_MAX_BYTES - 100)
    queued: list[p.StreamFrame] = []
    for stream_id in range(6):
        queued += [p.StreamOpen(stream_id=stream_id, port=80, id=""), p.StreamData(stream_id=stream_id, data=big)]
    for frame in queued:
        outbox.put(frame)
    raws = _messages(outbox)
    assert len(raws) > 1
    assert all(len(raw) <= p.STREAM_BATCH_MAX_BYTES + 2 for raw in raws)
    assert _entries([p.decode(raw) for raw in raws]) == queued


@pytest.mark.asyncio
async def test_a_value_the_binary_layout_cannot_hold_goes_out_as_the_old_frame_the_rest_batched():
    outbox = StreamOutbox(_nothing, p.PROTOCOL_VERSION)
    odd = p.StreamOpen(stream_id=2, port=70000, id="")  # no such TCP port: the agent will refuse it
    queued = [*_opening(1), odd, *_opening(3)]
    for frame in queued:
        outbox.put(frame)
    frames = [p.decode(raw) for raw in _messages(outbox)]
    assert odd in frames  # on its own, as JSON (as a protocol-4 tunnel would send it)
    assert len(frames) < len(queued)  # the others still batched
    assert _entries(frames) == queued


@pytest.mark.asyncio
async def test_a_protocol_4_outbox_sends_each_frame_on_its_own_and_a_closed_one_nothing():
    outbox = StreamOutbox(_nothing, 4)
    for frame in _opening(1):
        outbox.put(frame)
    frames = [p.decode(raw) for raw in _messages(outbox)]
    assert [type(frame) for frame in frames] == [p.StreamOpen, p.StreamData, p.StreamEnd]
    assert {frame.v for frame in frames} == {4}
    outbox.put(p.StreamWindow(stream_id=1, increment=1))
    outbox.close()
    outbox.put(p.StreamWindow(stream_id=1, increment=1))
    assert _messages(outbox) == []


async def _sent(comm: WebsocketCommunicator, timeout: float = 5) -> list[p.Frame]:
    """Every message the control plane sent until it went quiet for `timeout` seconds."""
    frames = []
    while not await comm.receive_nothing(timeout):
        message = await comm.receive_output(timeout)
        assert message["type"] == "websocket.send", message
        frames.append(p.decode(message["text"] if message.get("text") is not None else message["bytes"]))
    return frames


async def _open_many(node_id: str, count: int) -> list[TunnelStream]:
    """`count` small whole requests opened in this process at once (in one event-loop turn)."""
    return list(
        await asyncio.gather(
            *(
                TunnelStream.open(
                    node_id=node_id, port=8000, first_bytes=f"GET /{i} HTTP/1.1\r\n\r\n".encode(), finished=True
                )
                for i in range(count)
            )
        )
    )


@pytest.mark.asyncio
async def test_many_streams_opened_in_one_turn_reach_a_protocol_5_agent_as_one_message(node_identity):  # noqa: F811
    comm, version = await _tunnel(node_identity, "1-5")
    assert version == 5
    streams = await _open_many(node_identity.node_id, 64)
    sent = await _sent(comm, timeout=1)
    assert len(sent) == 1, [type(frame).__name__ for frame in sent]
    (batch,) = sent
    assert isinstance(batch, p.StreamFrames)
    assert batch.v == 5
    expected: list[tuple[str, int]] = []
    for stream in streams:
        expected += [
            ("stream_open", stream.stream_id),
            ("stream_data", stream.stream_id),
            ("stream_end", stream.stream_id),
        ]
    assert [(entry.TYPE, entry.stream_id) for entry in batch.frames] == expected
    for stream in streams:
        await stream.close()
    await comm.disconnect()


@pytest.mark.asyncio
async def test_a_protocol_4_agent_gets_each_streams_frames_as_separate_messages(node_identity):  # noqa: F811
    comm, version = await _tunnel(node_identity, "1-4")
    assert version == 4
    streams = await _open_many(node_identity.node_id, 8)
    sent = await _sent(comm, timeout=1)
    assert not [frame for frame in sent if isinstance(frame, p.StreamFrames | p.StreamBatch)]
    assert {frame.v for frame in sent} == {4}
    assert len(sent) == 3 * len(streams)
    for stream in streams:
        mine = [type(frame) for frame in sent if getattr(frame, "stream_id", None) == stream.stream_id]
        assert mine == [p.StreamOpen, p.StreamData, p.StreamEnd]
    for stream in streams:
        await stream.close()
    await comm.disconnect()


@pytest.mark.asyncio
async def test_a_streams_data_and_end_keep_their_order_with_other_streams_frames_between(node_identity):  # noqa: F811
    comm, _ = await _tunnel(node_identity, "1-5")
    one, two = [await TunnelStream.open(node_id=node_identity.node_id, port=8000) for _ in range(2)]
    await _sent(comm, timeout=0.5)  # the opens
    for index in range(5):
        await asyncio.gather(one.write(f"a{index}".encode()), two.write(f"b{index}".encode()))
    await asyncio.gather(one.finish_writing(), two.consumed(two.window))
    entries = _entries(await _sent(comm, timeout=1))
    for stream, prefix in ((one, "a"), (two, "b")):
        data = [
            entry.payload()
            for entry in entries
            if isinstance(entry, p.StreamData) and entry.stream_id == stream.stream_id
        ]
        assert data == [f"{prefix}{index}".encode() for index in range(5)]
    kinds = [type(entry) for entry in entries if entry.stream_id == one.stream_id]
    assert kinds == [p.StreamData] * 5 + [p.StreamEnd]  # the end after all its data
    assert [entry.increment for entry in entries if isinstance(entry, p.StreamWindow)] == [two.window]
    for stream in (one, two):
        await stream.close()
    await comm.disconnect()


@pytest.mark.asyncio
async def test_the_agents_stream_frames_reach_each_stream_in_order(node_identity):  # noqa: F811
    comm, _ = await _tunnel(node_identity, "1-5")
    one, two = [await TunnelStream.open(node_id=node_identity.node_id, port=8000) for _ in range(2)]
    await _sent(comm, timeout=0.5)
    credit = two._send_credit
    frames: list[p.StreamFrame] = [
        p.StreamData(stream_id=one.stream_id, data=b"HTTP/1.1 200 OK\r\n", v=5),
        p.StreamWindow(stream_id=two.stream_id, increment=1000, id="", v=5),
        p.StreamData(stream_id=two.stream_id, data=b"HTTP/1.1 404", v=5),
        p.StreamData(stream_id=12345, data=b"nobody's", v=5),
        p.StreamData(stream_id=one.stream_id, data=b"\r\nbody", v=5),
        p.StreamEnd(stream_id=one.stream_id, id="", v=5),
        p.StreamEnd(stream_id=two.stream_id, error="upstream reset", id="", v=5),
    ]
    await _send(comm, p.StreamFrames(frames=frames, v=5))
    assert await _read_all(one, 23) == b"HTTP/1.1 200 OK\r\n\r\nbody"
    assert await one.read(timeout=5) == b""  # the end, after all the data
    assert await _read_all(two, 12) == b"HTTP/1.1 404"
    assert await two.read(timeout=5) == b""
    assert two.error == "upstream reset"
    assert two._send_credit == credit + 1000
    await comm.disconnect()


@pytest.mark.asyncio
async def test_a_failing_stream_writer_closes_the_tunnel_with_a_logged_reason(node_identity, monkeypatch, caplog):  # noqa: F811
    real_send = AgentTunnelConsumer._send_message

    async def refuse_batches(self: Any, encoded: str | bytes) -> None:
        if isinstance(encoded, bytes) and encoded[:1] == bytes([p.FRAMES_MAGIC]):
            raise RuntimeError("the socket refused the message")
        await real_send(self, encoded)

    monkeypatch.setattr(AgentTunnelConsumer, "_send_message", refuse_batches)
    comm, _ = await _tunnel(node_identity, "1-5")
    with caplog.at_level(logging.ERROR, logger="fleet.tunnel"):
        await _open_many(node_identity.node_id, 4)
        message = await comm.receive_output(5)
        assert message == {"type": "websocket.close", "code": 1011, "reason": "stream sender failed"}
    assert "sending stream frames failed; closing" in caplog.text
    assert "the socket refused the message" in caplog.text
    await comm.disconnect()

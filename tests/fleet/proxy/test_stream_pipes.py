"""Stream pipes on the real Redis: what a tunnel's replica sends back to a proxying process."""

from __future__ import annotations

import asyncio

import pytest
import redis
from django.conf import settings

from fleet.proxy import stream_pipes


def test_every_stream_message_survives_encoding():
    messages = [
        {"type": "stream.opened", "consumer": "specific.abc!def"},
        {"type": "stream.data", "data": bytes(range(256)) * 3},
        {"type": "stream.window", "increment": 1 << 40},
        {"type": "stream.end", "error": ""},
        {"type": "stream.end", "error": "cannot connect to port 9: refused"},
    ]
    for message in messages:
        assert stream_pipes.decode(stream_pipes.encode(message)) == message
    with pytest.raises(ValueError, match="not a stream message"):
        stream_pipes.encode({"type": "node.command"})
    with pytest.raises(ValueError, match="unknown stream message"):
        stream_pipes.decode(b"Zjunk")


def test_writer_never_waits_and_the_reader_gets_everything_in_order():
    key = stream_pipes.new_pipe_key()
    chunks = [bytes([i]) * 100_000 for i in range(20)]

    async def scenario() -> list[dict]:
        writer = stream_pipes.PipeWriter(key)
        writer.deliver({"type": "stream.opened", "consumer": "c"})
        for chunk in chunks:
            writer.deliver({"type": "stream.data", "data": chunk})  # returns at once, flushed in batches
        writer.deliver({"type": "stream.end", "error": ""})
        received: list[dict] = []
        while not received or received[-1]["type"] != "stream.end":
            got = await stream_pipes.pop(key, timeout=5)
            assert got, "nothing arrived"
            received += got
        await writer.drained()
        return received

    received = asyncio.run(scenario())
    assert received[0] == {"type": "stream.opened", "consumer": "c"}
    assert [m["data"] for m in received[1:-1]] == chunks
    assert received[-1] == {"type": "stream.end", "error": ""}
    client = redis.Redis.from_url(settings.REDIS_URL)
    assert not client.exists(key)  # fully read: the list is gone


def test_an_unread_pipe_expires_and_remove_drops_it():
    key = stream_pipes.new_pipe_key()
    client = redis.Redis.from_url(settings.REDIS_URL)

    async def scenario() -> None:
        writer = stream_pipes.PipeWriter(key)
        writer.deliver({"type": "stream.data", "data": b"left behind"})
        await writer.drained()

    asyncio.run(scenario())
    assert 0 < client.ttl(key) <= stream_pipes.PIPE_TTL_S
    asyncio.run(stream_pipes.remove(key))
    assert not client.exists(key)


def test_pop_waits_no_longer_than_asked():
    async def scenario() -> tuple[list, float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        got = await stream_pipes.pop(stream_pipes.new_pipe_key(), timeout=0.2)
        return got, loop.time() - started

    got, waited = asyncio.run(scenario())
    assert got == []
    assert waited < 2


def test_many_pipes_written_at_once_each_get_their_messages_in_order():
    keys = [stream_pipes.new_pipe_key() for _ in range(50)]

    async def scenario() -> dict[str, list[dict]]:
        writers = [stream_pipes.PipeWriter(key) for key in keys]
        for token in range(20):  # interleaved, as 50 streams' tokens arrive through one tunnel
            for index, writer in enumerate(writers):
                writer.deliver({"type": "stream.data", "data": f"{index}:{token}".encode()})
                if token == 10:
                    await asyncio.sleep(0)  # let a flush start in the middle of the stream
        for writer in writers:
            writer.deliver({"type": "stream.end", "error": ""})
        received: dict[str, list[dict]] = {}
        for key in keys:
            got: list[dict] = []
            while not got or got[-1]["type"] != "stream.end":
                more = await stream_pipes.pop(key, timeout=5)
                assert more, "nothing arrived"
                got += more
            received[key] = got
        for writer in writers:
            await writer.drained()
        return received

    received = asyncio.run(scenario())
    for index, key in enumerate(keys):
        assert [m["data"] for m in received[key][:-1]] == [f"{index}:{token}".encode() for token in range(20)]
        assert received[key][-1] == {"type": "stream.end", "error": ""}

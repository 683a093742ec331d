"""The tunnel's stream seam: the proxy registers its handler at app start, and the tunnel's answers to a
stream opened elsewhere reach that process through it (on the real Redis)."""

from __future__ import annotations

import asyncio

from fleet.proxy import stream_pipes
from fleet.proxy.wiring import PipeStreamHandler
from fleet.tunnel import streams_seam


def test_the_app_registered_the_proxys_handler():
    assert isinstance(streams_seam.stream_handler(), PipeStreamHandler)


def test_a_reply_sink_delivers_into_the_pipe_its_opener_reads():
    pipe = stream_pipes.new_pipe_key()

    async def scenario() -> list[dict]:
        sink = streams_seam.stream_handler().reply_sink(pipe)
        try:
            sink.deliver({"type": "stream.opened", "consumer": "c"})
            sink.deliver({"type": "stream.data", "data": b"hello"})
            got: list[dict] = []
            while len(got) < 2:
                batch = await stream_pipes.pop(pipe, timeout=5)
                assert batch, "nothing arrived"
                got += batch
            return got
        finally:
            await stream_pipes.remove(pipe)

    assert asyncio.run(scenario()) == [
        {"type": "stream.opened", "consumer": "c"},
        {"type": "stream.data", "data": b"hello"},
    ]

"""How the proxy reaches behind daphne's `send` to wait for the client's socket.

The real thing (daphne holding a response back for a client that stops reading) is tested end to end
in tests/e2e/test_proxy_streams.py; these pin the contract with Twisted's producer interface.
"""

from __future__ import annotations

import asyncio
import functools

from fleet.proxy.write_pressure import WritePressure


class FakeRequest:
    """The parts of twisted.web.http.Request that WritePressure uses."""

    def __init__(self) -> None:
        self.channel = object()
        self.producer = None
        self.streaming: bool | None = None
        self.unregistered = 0

    def registerProducer(self, producer, streaming):
        self.producer, self.streaming = producer, streaming

    def unregisterProducer(self):
        self.producer = None
        self.unregistered += 1


async def handle_reply(request, message):  # stands for daphne.server.Server.handle_reply
    pass


def test_waits_while_twisted_says_the_buffer_is_full():
    request = FakeRequest()
    pressure = WritePressure.of(functools.partial(handle_reply, request))
    pressure.start()
    assert request.producer is pressure
    assert request.streaming is True

    async def scenario() -> list[str]:
        seen = []
        pressure.pauseProducing()  # Twisted: the transport's buffer went over its high-water mark
        waiter = asyncio.ensure_future(pressure.wait())
        await asyncio.sleep(0.05)
        seen.append("waiting" if not waiter.done() else "passed")
        pressure.resumeProducing()  # drained
        await asyncio.wait_for(waiter, 1)
        seen.append("resumed")
        pressure.pauseProducing()
        pressure.stopProducing()  # the connection is gone: nobody may wait forever
        await asyncio.wait_for(pressure.wait(), 1)
        seen.append("released")
        return seen

    assert asyncio.run(scenario()) == ["waiting", "resumed", "released"]
    pressure.stop()
    pressure.stop()
    assert request.producer is None
    assert request.unregistered == 1


def test_leaves_a_request_alone_that_has_a_producer_or_no_connection():
    busy = FakeRequest()
    busy.producer = "someone else's"
    WritePressure.of(functools.partial(handle_reply, busy)).start()
    assert busy.producer == "someone else's"
    gone = FakeRequest()
    pressure = WritePressure.of(functools.partial(handle_reply, gone))
    gone.channel = None
    pressure.start()
    pressure.stop()
    assert gone.producer is None
    assert gone.unregistered == 0


def test_other_asgi_servers_never_wait():
    async def send(message):
        pass

    pressure = WritePressure.of(send)
    pressure.start()
    pressure.pauseProducing()  # not registered anywhere; nothing will ever resume it
    pressure.stop()
    asyncio.run(asyncio.wait_for(pressure.wait(), 1))

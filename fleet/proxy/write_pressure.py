"""Backpressure from the client's socket to a proxied response.

Daphne's ASGI `send` for `http.response.body` returns as soon as the bytes sit in Twisted's write
buffer; it never waits for the socket. A relay that forwards as fast as the node produces would then
pile up a whole response in the control plane whenever the client reads slower than the node writes
(and Twisted re-copies a large pending buffer on every socket write). `WritePressure` registers a
streaming producer with the Twisted request behind daphne's `send`, so the relay waits while that
buffer is above Twisted's high-water mark: credit goes back to the agent only as fast as the client
reads, and the control plane holds at most about one chunk per response.

Under any other ASGI server it never waits: uvicorn's `send` for a response body itself waits while the
transport's buffer is above its high-water mark, so the relay is held back there already (the same
end-to-end test runs on both servers); tests that call the app directly have no socket.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any


class WritePressure:
    """`await pressure.wait()` returns once the client's socket can take more (at once if unknown)."""

    def __init__(self, request: Any | None) -> None:
        self._request = request
        self._writable = asyncio.Event()
        self._writable.set()
        self._registered = False

    @classmethod
    def of(cls, send: Any) -> WritePressure:
        """The pressure of the daphne request behind `send` (daphne passes `partial(handle_reply, request)`;
        a wrapper that keeps it as `__wrapped__`, such as `request_meter.MeteredSend`, is looked through)."""
        send = getattr(send, "__wrapped__", send)
        request = None
        if isinstance(send, functools.partial) and send.args:
            candidate = send.args[0]
            if callable(getattr(candidate, "registerProducer", None)) and getattr(candidate, "channel", None):
                request = candidate
        return cls(request)

    def start(self) -> None:
        """Begin watching the buffer (call after the response head went out)."""
        if self._request is None or self._registered or self._request.channel is None:
            return
        if self._request.producer is not None:  # someone else's producer: leave the request alone
            return
        self._request.registerProducer(self, True)
        self._registered = True

    @property
    def writable(self) -> bool:
        """Whether the client's socket can take more now (`wait` would return at once)."""
        return self._writable.is_set()

    async def wait(self) -> None:
        await self._writable.wait()

    def stop(self) -> None:
        """Stop watching (before the last body message: Twisted wants producers gone by `finish`)."""
        self._writable.set()
        if self._registered:
            self._registered = False
            if self._request.channel is not None:
                self._request.unregisterProducer()

    # IPushProducer, called by Twisted on the event loop's thread

    def pauseProducing(self) -> None:
        self._writable.clear()

    def resumeProducing(self) -> None:
        self._writable.set()

    def stopProducing(self) -> None:  # the connection is gone
        self._writable.set()

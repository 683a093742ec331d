"""Agent side of proxied streams: TCP byte pipes to local ports, multiplexed over the tunnel.

The control plane opens a stream (`StreamOpen`) to a port on this node and writes the raw HTTP
request; the agent connects to 127.0.0.1:<port> (or, for a KubeRay head, to the in-cluster `host` the
frame names, when it manages a head there) and pipes bytes both ways. Flow control is
credit-based per stream and per direction: the agent reads from the local socket only as many bytes as
the control plane has granted (`StreamWindow`), so a slow client never makes the agent buffer without
bound; and it grants the control plane credit back only after request bytes were written to the local
socket. Stream bytes go out as bulk frames, which the tunnel's sender always puts behind control frames.
A stream's task that fails unexpectedly is logged once with its traceback and aborts that stream (a
`StreamEnd` with an error), never leaving it half open.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine
from typing import Any

from agent import protocol as p

log = logging.getLogger("agent.proxy")

CHUNK_BYTES = 256 * 1024
FIRST_READ_BYTES = 16 * 1024  # a stream's read buffer starts here and doubles while reads fill it
# Open streams per tunnel session; each holds one local socket and a read buffer (16-256 KiB). Streaming
# inference keeps one open per client for the whole answer, so the cap is well above 1,000 clients.
MAX_STREAMS = int(os.environ.get("CLEVERTHIS_MAX_STREAMS") or 4096)


class _Stream:
    """One proxied connection and its two credit counters."""

    def __init__(self, stream_id: int, port: int, send_credit: int, host: str = "") -> None:
        self.stream_id = stream_id
        self.port = port
        self.host = host or "127.0.0.1"
        self.send_credit = send_credit
        self.inbound: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.tasks: list[asyncio.Task[None]] = []
        self.upstream: _Upstream | None = None
        self.ended = False


class _Upstream(asyncio.BufferedProtocol):
    """The local socket of one stream: response bytes go straight from the kernel into frames.

    Reads land in a reusable buffer no larger than the credit left (so the agent never holds or sends
    more than the control plane granted), and reading pauses while the credit is zero. There is no
    StreamReader in between: one copy per chunk, out of the buffer into the frame.
    """

    def __init__(self, stream: _Stream, send: Callable[[p.Frame], None]) -> None:
        self.stream = stream
        self._send = send
        self._buffer = bytearray(FIRST_READ_BYTES)
        self._paused = False
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drained = asyncio.Event()
        self._drained.set()

    # -- reading (local socket → control plane)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._pause_if_no_credit()

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self._buffer)[: max(1, min(len(self._buffer), self.stream.send_credit))]

    def buffer_updated(self, nbytes: int) -> None:
        self.stream.send_credit -= nbytes
        self._send(p.StreamData(stream_id=self.stream.stream_id, data=bytes(memoryview(self._buffer)[:nbytes])))
        if nbytes == len(self._buffer) and nbytes < CHUNK_BYTES:  # a bulk body: read bigger chunks
            self._buffer = bytearray(min(CHUNK_BYTES, 2 * nbytes))
        self._pause_if_no_credit()

    def credit_granted(self) -> None:
        if self._paused and self.stream.send_credit > 0 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def _pause_if_no_credit(self) -> None:
        if not self._paused and self.stream.send_credit <= 0 and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        return False  # close our end too: the response is complete

    def connection_lost(self, exc: Exception | None) -> None:
        self._drained.set()
        if not self.closed.done():
            self.closed.set_result(None)

    # -- writing (control plane → local socket)

    def pause_writing(self) -> None:
        self._drained.clear()

    def resume_writing(self) -> None:
        self._drained.set()

    async def write(self, data: bytes) -> None:
        """Write request bytes and wait until the socket took them (credit goes back only then)."""
        assert self.transport is not None
        self.transport.write(data)
        await self._drained.wait()
        if self.transport.is_closing():
            raise ConnectionResetError("local connection closed")


class StreamManager:
    """All open streams of one tunnel session; `handle` is fed every stream frame from the control plane."""

    def __init__(
        self,
        send: Callable[[p.Frame], None],
        *,
        allowed_port: Callable[[int], bool] | None = None,
        allowed_target: Callable[[str, int], bool] | None = None,
    ) -> None:
        self._send = send
        self._allowed_port = allowed_port or (lambda port: 0 < port < 65536)
        self._allowed_target = allowed_target or (lambda host, port: False)
        self._streams: dict[int, _Stream] = {}

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def handle(self, frame: p.Frame) -> None:
        """Dispatch one stream frame; never blocks the tunnel's receive loop."""
        if isinstance(frame, p.StreamOpen):
            self._open(frame)
            return
        stream = self._streams.get(getattr(frame, "stream_id", -1))
        if stream is None:
            return
        if isinstance(frame, p.StreamData):
            stream.inbound.put_nowait(frame.payload())
        elif isinstance(frame, p.StreamWindow):
            stream.send_credit += max(0, frame.increment)
            if stream.upstream is not None:
                stream.upstream.credit_granted()
        elif isinstance(frame, p.StreamEnd):
            if frame.error:
                self._close(stream)
            else:
                stream.inbound.put_nowait(None)

    def close_all(self) -> None:
        """Tear down every stream (the tunnel session ended)."""
        for stream in list(self._streams.values()):
            self._close(stream, notify=False)

    def _open(self, frame: p.StreamOpen) -> None:
        if frame.stream_id in self._streams:
            self._send(p.StreamEnd(stream_id=frame.stream_id, error="stream id already open"))
            return
        if len(self._streams) >= MAX_STREAMS:
            self._send(p.StreamEnd(stream_id=frame.stream_id, error="too many open streams on this node"))
            return
        if frame.host and not self._allowed_target(frame.host, frame.port):
            self._send(p.StreamEnd(stream_id=frame.stream_id, error=f"{frame.host}:{frame.port} is not proxied"))
            return
        if not frame.host and not self._allowed_port(frame.port):
            self._send(p.StreamEnd(stream_id=frame.stream_id, error=f"port {frame.port} is not proxied"))
            return
        stream = _Stream(frame.stream_id, frame.port, frame.window, frame.host)
        self._streams[frame.stream_id] = stream
        self._start(stream, self._run(stream))

    def _start(self, stream: _Stream, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run one of the stream's tasks, supervised by `_task_done`."""
        task = asyncio.ensure_future(coro)
        stream.tasks.append(task)
        task.add_done_callback(lambda done: self._task_done(stream, done))
        return task

    def _task_done(self, stream: _Stream, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        error = task.exception()
        log.error("stream %s to port %s failed; aborting it", stream.stream_id, stream.port, exc_info=error)
        self._close(stream, error=f"agent error: {type(error).__name__}")

    async def _run(self, stream: _Stream) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await asyncio.wait_for(
                loop.create_connection(lambda: _Upstream(stream, self._send), stream.host, stream.port), timeout=10
            )
        except (OSError, TimeoutError) as exc:
            where = f"port {stream.port}" if stream.host == "127.0.0.1" else f"{stream.host}:{stream.port}"
            self._send(p.StreamEnd(stream_id=stream.stream_id, error=f"cannot connect to {where}: {exc}"))
            self._streams.pop(stream.stream_id, None)
            return
        stream.upstream = upstream
        pump = self._start(stream, self._pump_to_local(stream, upstream))
        try:
            await upstream.closed  # the response went out frame by frame as it arrived
        finally:
            pump.cancel()
            if upstream.transport is not None:
                upstream.transport.close()
            self._close(stream)

    async def _pump_to_local(self, stream: _Stream, upstream: _Upstream) -> None:
        """Request bytes from the control plane → local socket; credit goes back once written."""
        try:
            while True:
                chunk = await stream.inbound.get()
                if chunk is None:
                    # The request is complete. No half-close: servers such as uvicorn read EOF as "client
                    # gone" and cancel streaming responses; the server ends the connection itself.
                    return
                await upstream.write(chunk)
                self._send(p.StreamWindow(stream_id=stream.stream_id, increment=len(chunk)))
        except ConnectionError:
            if upstream.transport is not None:
                upstream.transport.close()

    def _close(self, stream: _Stream, *, notify: bool = True, error: str = "") -> None:
        if stream.ended:
            return
        stream.ended = True
        self._streams.pop(stream.stream_id, None)
        if notify:
            self._send(p.StreamEnd(stream_id=stream.stream_id, error=error))
        if stream.upstream is not None and stream.upstream.transport is not None:
            stream.upstream.transport.close()
        current = asyncio.current_task()
        for task in stream.tasks:
            if task is not current:
                task.cancel()

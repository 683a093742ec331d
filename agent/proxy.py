"""Agent side of proxied streams: TCP byte pipes to local ports, multiplexed over the tunnel.

The control plane opens a stream (`StreamOpen`) to a port on this node and writes the raw HTTP
request; the agent connects to 127.0.0.1:<port> and pipes bytes both ways. Flow control is
credit-based per stream and per direction: the agent reads from the local socket only as many bytes as
the control plane has granted (`StreamWindow`), so a slow client never makes the agent buffer without
bound; and it grants the control plane credit back only after request bytes were written to the local
socket. Stream bytes go out as bulk frames, which the tunnel's sender always puts behind control frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from agent import protocol as p

log = logging.getLogger("agent.proxy")

CHUNK_BYTES = 256 * 1024
MAX_STREAMS = 512


class _Stream:
    """One proxied connection and its two credit counters."""

    def __init__(self, stream_id: int, port: int, send_credit: int) -> None:
        self.stream_id = stream_id
        self.port = port
        self.send_credit = send_credit
        self.credit_changed = asyncio.Event()
        self.inbound: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.tasks: list[asyncio.Task[None]] = []
        self.ended = False


class StreamManager:
    """All open streams of one tunnel session; `handle` is fed every stream frame from the control plane."""

    def __init__(self, send: Callable[[p.Frame], None], *, allowed_port: Callable[[int], bool] | None = None) -> None:
        self._send = send
        self._allowed_port = allowed_port or (lambda port: 0 < port < 65536)
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
            stream.credit_changed.set()
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
        if not self._allowed_port(frame.port):
            self._send(p.StreamEnd(stream_id=frame.stream_id, error=f"port {frame.port} is not proxied"))
            return
        stream = _Stream(frame.stream_id, frame.port, frame.window)
        self._streams[frame.stream_id] = stream
        stream.tasks.append(asyncio.ensure_future(self._run(stream)))

    async def _run(self, stream: _Stream) -> None:
        try:
            # a read buffer of a few chunks, so bulk responses go out in full CHUNK_BYTES frames
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", stream.port, limit=4 * CHUNK_BYTES), timeout=10
            )
        except (OSError, TimeoutError) as exc:
            self._send(p.StreamEnd(stream_id=stream.stream_id, error=f"cannot connect to port {stream.port}: {exc}"))
            self._streams.pop(stream.stream_id, None)
            return
        upstream = asyncio.ensure_future(self._pump_to_local(stream, writer))
        stream.tasks.append(upstream)
        try:
            await self._pump_from_local(stream, reader)
        finally:
            upstream.cancel()
            with contextlib.suppress(Exception):
                writer.close()
            self._close(stream)

    async def _pump_to_local(self, stream: _Stream, writer: asyncio.StreamWriter) -> None:
        """Request bytes from the control plane → local socket; credit goes back once written."""
        while True:
            chunk = await stream.inbound.get()
            if chunk is None:
                # The request is complete. No half-close: servers such as uvicorn read EOF as "client
                # gone" and cancel streaming responses; the server ends the connection itself.
                return
            writer.write(chunk)
            await writer.drain()
            self._send(p.StreamWindow(stream_id=stream.stream_id, increment=len(chunk)))

    async def _pump_from_local(self, stream: _Stream, reader: asyncio.StreamReader) -> None:
        """Local socket → control plane, never more than the granted credit in flight."""
        while True:
            while stream.send_credit <= 0:
                stream.credit_changed.clear()
                await stream.credit_changed.wait()
            data = await reader.read(min(CHUNK_BYTES, stream.send_credit))
            if not data:
                return
            stream.send_credit -= len(data)
            self._send(p.StreamData.of(stream.stream_id, data))

    def _close(self, stream: _Stream, *, notify: bool = True) -> None:
        if stream.ended:
            return
        stream.ended = True
        self._streams.pop(stream.stream_id, None)
        if notify:
            self._send(p.StreamEnd(stream_id=stream.stream_id))
        current = asyncio.current_task()
        for task in stream.tasks:
            if task is not current:
                task.cancel()

"""The proxied streams of one agent tunnel, both ways: `StreamRelay`, the stream half of the tunnel consumer.

Towards the agent: a stream opened in this process (`open_local_stream`: by a request here, or by another
process over a peer link) and its request bytes, credit and end (`stream_message`) are queued on the
tunnel's `StreamOutbox` and written coalesced (from protocol 5 on, what one event-loop turn queued goes as
one message). From the agent: stream data, window increments and ends (alone or batched) are handed to
each stream's sink (`fleet.tunnel.streams_seam.StreamSink`) in the order sent. A failing writer closes the
tunnel (1011); the consumer ends every stream of a tunnel that closes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

from agent import protocol as p
from fleet.tunnel.outbox import StreamOutbox
from fleet.tunnel.streams_seam import LocalStream, StreamSink

log = logging.getLogger("fleet.tunnel")


class StreamRelay:
    """The streams of the tunnel consumer (`fleet.tunnel.consumer.AgentTunnelConsumer`), which holds the
    socket, its protocol version and its close."""

    node_id: UUID | None
    protocol: int
    # stream id → its sink: the stream itself (a request in this process) or a peer link back to another one
    streams: dict[int, StreamSink]
    _closing: asyncio.Future[None] | None = None
    _outbox: StreamOutbox | None = None  # stream frames towards the agent, written by `_outbox_task`
    _outbox_task: asyncio.Task[None] | None = None
    _send_message: Callable[[str | bytes], Awaitable[None]]
    close: Callable[..., Awaitable[None]]

    def _stream_gone(self) -> None:
        """A stream ended (the consumer closes a retiring tunnel once none is left: `fleet.tunnel.drain`)."""

    # ---- stream frames from the agent

    async def _on_stream_data(self, frame: p.StreamData) -> None:
        await self._to_stream(frame.stream_id, {"type": "stream.data", "data": frame.payload()})

    async def _on_stream_batch(self, frame: p.StreamBatch) -> None:
        """Several streams' data in one message: each chunk to its stream, in the order sent."""
        streams = self.streams
        for stream_id, data in frame.chunks:
            target = streams.get(stream_id)
            if target is not None:
                target.deliver({"type": "stream.data", "data": data})

    async def _on_stream_frames(self, frame: p.StreamFrames) -> None:
        """Several streams' data, window increments and ends in one message: each to its stream, in order."""
        streams = self.streams
        for entry in frame.frames:
            target = streams.get(entry.stream_id)
            if target is None:
                continue
            if type(entry) is p.StreamData:
                target.deliver({"type": "stream.data", "data": entry.data})
            elif type(entry) is p.StreamWindow:
                target.deliver({"type": "stream.window", "increment": entry.increment})
            elif type(entry) is p.StreamEnd:
                target.deliver({"type": "stream.end", "error": entry.error})
                streams.pop(entry.stream_id, None)
                self._stream_gone()
            # (an open from the agent means nothing: only the control plane opens streams)

    async def _on_stream_window(self, frame: p.StreamWindow) -> None:
        await self._to_stream(frame.stream_id, {"type": "stream.window", "increment": frame.increment})

    async def _on_stream_end(self, frame: p.StreamEnd) -> None:
        await self._to_stream(frame.stream_id, {"type": "stream.end", "error": frame.error})
        self.streams.pop(frame.stream_id, None)
        self._stream_gone()

    async def _to_stream(self, stream_id: int, message: dict[str, Any]) -> None:
        """Hand a message to the process proxying stream `stream_id`: in memory if it is this one."""
        target = self.streams.get(stream_id)
        if target is not None:
            target.deliver(message)

    STREAM_HANDLERS: dict[type, Any] = {
        p.StreamData: _on_stream_data,
        p.StreamBatch: _on_stream_batch,
        p.StreamFrames: _on_stream_frames,
        p.StreamWindow: _on_stream_window,
        p.StreamEnd: _on_stream_end,
    }

    # ---- streams opened in this process, towards the agent

    async def stream_open(self, message: dict[str, Any]) -> None:
        """`stream.open` (group) from a replica of an older version (rolling deploy): streams now come over
        peer links (`fleet.tunnel.peer_serving`); ignored, so that replica answers 502 until it is replaced."""
        log.warning("ignoring a channel-layer stream.open for node %s (a replica of an older version)", self.node_id)

    async def open_local_stream(self, stream: LocalStream, opening: dict[str, Any]) -> None:
        """A stream opened in this process (`fleet.tunnel.local_tunnels`): by a request here, or by
        another process over a peer link (`fleet.tunnel.peer_serving`)."""
        self.streams[stream.stream_id] = stream
        await self._open_stream(stream.stream_id, opening)

    async def _open_stream(self, stream_id: int, opening: dict[str, Any]) -> None:
        """Tell the agent: open, then the first request bytes and the request's end if they came along.

        From protocol 5 on these, and whatever else is queued for the agent's streams in this event-loop
        turn, go out as one message (`StreamOutbox`).
        """
        frames: list[p.StreamFrame] = [
            p.StreamOpen(
                stream_id=stream_id,
                port=int(opening["port"]),
                window=int(opening["window"]),
                host=str(opening.get("host", "")),
            )
        ]
        if opening.get("data"):
            frames.append(p.StreamData.of(stream_id, opening["data"]))
        if opening.get("end"):
            frames.append(p.StreamEnd(stream_id=stream_id))
        outbox = self._stream_outbox()
        for frame in frames:
            outbox.put(frame)

    async def stream_message(self, message: dict[str, Any]) -> None:
        """A message from a stream opened in this process: request bytes (`stream.data`), response credit
        returned (`stream.window`), or the request's end (`stream.end`; aborted when `error` is set)."""
        stream_id = message["stream_id"]
        if stream_id not in self.streams:
            return
        kind = message["type"]
        if kind == "stream.data":
            self._stream_outbox().put(p.StreamData.of(stream_id, message["data"]))
        elif kind == "stream.window":
            self._stream_outbox().put(p.StreamWindow(stream_id=stream_id, increment=int(message["increment"])))
        elif kind == "stream.end":
            if message.get("error"):
                self.streams.pop(stream_id, None)
            self._stream_outbox().put(p.StreamEnd(stream_id=stream_id, error=message.get("error", "")))
            self._stream_gone()
        else:
            raise ValueError(f"not a stream message: {kind}")

    def _stream_outbox(self) -> StreamOutbox:
        """This tunnel's outbox of stream frames, its writer started (and supervised) on first use."""
        if self._outbox is None:
            self._outbox = StreamOutbox(self._send_message, self.protocol)
            self._outbox_task = asyncio.ensure_future(self._outbox.run())
            self._outbox_task.add_done_callback(self._outbox_done)
        return self._outbox

    def _outbox_done(self, task: asyncio.Future[None]) -> None:
        """The stream writer failed (the socket refused a message): log why and close the tunnel."""
        if task.cancelled() or task.exception() is None:
            return
        log.error("tunnel of node %s: sending stream frames failed; closing", self.node_id, exc_info=task.exception())
        if self._outbox is not None:
            self._outbox.close()
        self._closing = asyncio.ensure_future(self.close(code=1011, reason="stream sender failed"))

"""The agent's send queue for one tunnel session: a single writer for the socket, control frames first.

Progress, results, heartbeats and stream frames are queued with `FrameSender.send` (never blocking) and
written by `FrameSender.run`; stream data waits behind every control frame and is batched when the
socket was busy (`StreamBatch`, `StreamFrames`, by the session's protocol version).
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

from agent import protocol as p


class FrameSender:
    """Single writer for one socket; control frames always jump ahead of queued bulk stream data.

    Stream data is queued as (stream id, bytes) and framed only when the socket is free: from protocol 3
    on, the chunks of consecutive data queued meanwhile (any streams, in order, up to
    `STREAM_BATCH_MAX_BYTES`) go out as one `StreamBatch` message. Nothing waits for a batch to fill: a
    lone chunk goes out at once as `StreamData`, and chunks coalesce only while the socket was busy or
    when several streams' bytes arrived in the same event-loop turn. A protocol-2 peer gets one
    `StreamData` per chunk. From protocol 5 on, streams' window increments and aborts queued together
    go out as one `StreamFrames` message, and so do streams' normal ends with the data queued around
    them; an older peer gets each of those frames on its own.
    """

    def __init__(self, ws: Any, version: int = p.PROTOCOL_VERSION) -> None:
        self._ws = ws
        self.version = version  # the session's protocol version: every frame goes out at it
        self.batching = version >= p.STREAM_BATCH_SINCE
        self.stream_frames = version >= p.STREAM_FRAMES_SINCE
        # encoded frames, or (protocol 5 on) stream windows and aborts still to be framed together
        self._control: collections.deque[str | bytes | p.StreamWindow | p.StreamEnd] = collections.deque()
        # (stream id, bytes) of stream data, and streams' normal ends, still to be framed
        self._bulk: collections.deque[tuple[int, bytes] | p.StreamEnd] = collections.deque()
        self._wakeup = asyncio.Event()
        self.closed = False

    def send(self, frame: p.Frame) -> None:
        """Queue `frame`; never blocks."""
        if self.closed:
            return
        if type(frame) is p.StreamData:
            self._bulk.append((frame.stream_id, frame.data))
        elif isinstance(frame, p.StreamEnd) and not frame.error:
            # A stream's normal end queues behind its data (it must not overtake the last chunks); an
            # abort (StreamEnd with an error) and every other control frame go first.
            self._bulk.append(frame)
        elif self.stream_frames and isinstance(frame, p.StreamWindow | p.StreamEnd):
            self._control.append(frame)
        else:
            self._control.append(p.encode(p.at_version(frame, self.version)))
        self._wakeup.set()

    async def flush(self, timeout: float) -> None:
        """Wait (at most `timeout` seconds) until everything queued has been handed to the socket."""
        deadline = time.monotonic() + timeout
        while (self._control or self._bulk) and not self.closed and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    def next_message(self) -> str | bytes | None:
        """The next message to put on the socket: a control frame if any is queued, else bulk (None: empty)."""
        if self._control:
            return self._next_control()
        if not self._bulk:
            return None
        return self._next_bulk()

    def _next_control(self) -> str | bytes:
        control = self._control
        item = control.popleft()
        if isinstance(item, str | bytes):
            return item
        frames: list[p.StreamFrame] = [item]  # stream windows and aborts queued together: one message
        size = p.entry_size(item)
        while control and not isinstance(control[0], str | bytes):
            following = p.entry_size(control[0])
            if size + following > p.STREAM_BATCH_MAX_BYTES:
                break
            frames.append(control.popleft())  # type: ignore[arg-type]  # (a stream frame: checked above)
            size += following
        return self._stream_message(frames)

    def _next_bulk(self) -> str | bytes:
        bulk = self._bulk
        first = bulk.popleft()
        run = [first]
        size = _bulk_size(first)
        while bulk and self._joins(run[0], bulk[0]):
            following = _bulk_size(bulk[0])
            if size + following > p.STREAM_BATCH_MAX_BYTES:
                break
            run.append(bulk.popleft())
            size += following
        if len(run) == 1:
            return self._stream_message([_as_frame(first)])
        if all(isinstance(item, tuple) for item in run):
            return p.encode_batch(run, self.version)  # type: ignore[arg-type]  # (all data: checked above)
        return p.encode_stream_frames([_as_frame(item) for item in run], self.version)

    def _joins(self, first: tuple[int, bytes] | p.StreamEnd, following: tuple[int, bytes] | p.StreamEnd) -> bool:
        """Whether `following` may go in the same message as the run that starts with `first`."""
        if self.stream_frames:
            return True
        return self.batching and isinstance(first, tuple) and isinstance(following, tuple)

    def _stream_message(self, frames: list[p.StreamFrame]) -> str | bytes:
        """One stream frame as its own message, or several as one `StreamFrames` (protocol 5 on)."""
        if len(frames) == 1:
            return p.encode(p.at_version(frames[0], self.version))
        return p.encode_stream_frames(frames, self.version)

    async def run(self) -> None:
        """Drain the queues onto the socket until it closes."""
        try:
            while True:
                message = self.next_message()
                if message is None:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                await self._ws.send(message)
        finally:
            self.closed = True


def _bulk_size(item: tuple[int, bytes] | p.StreamEnd) -> int:
    """The bytes a bulk item takes in a batch message."""
    return len(item[1]) + p.ENTRY_OVERHEAD if isinstance(item, tuple) else p.entry_size(item)


def _as_frame(item: tuple[int, bytes] | p.StreamEnd) -> p.StreamFrame:
    """A bulk item as the stream frame it stands for."""
    return p.StreamData(stream_id=item[0], data=item[1]) if isinstance(item, tuple) else item

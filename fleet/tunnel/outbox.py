"""The tunnel's writer of stream frames towards its agent: what is queued in one event-loop turn is one message.

A proxied request used to cost the tunnel up to three WebSocket messages towards the agent (open, the
request's bytes, its end), and every credit return or end of every stream one more; with hundreds of
streams opening at once, that is a message and a socket write per frame. `StreamOutbox` queues a
tunnel's stream frames and one writer task puts them on the socket: from protocol 5 on, everything
queued while it waited for its turn (one event-loop turn, or while the previous send was under way) goes
out as one `StreamFrames` message, bounded at `STREAM_BATCH_MAX_BYTES`; a lone frame goes out as it
always did, and nothing waits for a batch to fill. An agent of protocol 4 or older gets each frame as a
message of its own. Frames keep their order (one queue, one writer), so a stream's end never overtakes
its data; control frames (commands, heartbeat acks) do not pass through here.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable

from agent import protocol as p


class StreamOutbox:
    """One tunnel's queue of stream frames and the loop (`run`) that writes them with `send`."""

    def __init__(self, send: Callable[[str | bytes], Awaitable[None]], version: int) -> None:
        self._send = send
        self.version = version
        self.batching = version >= p.STREAM_FRAMES_SINCE
        self._queue: collections.deque[p.StreamFrame] = collections.deque()
        self._wakeup = asyncio.Event()
        self.closed = False

    def put(self, frame: p.StreamFrame) -> None:
        """Queue `frame` for the agent; never blocks (dropped once the outbox is closed)."""
        if self.closed:
            return
        self._queue.append(frame)
        self._wakeup.set()

    def close(self) -> None:
        """Drop what is queued and take nothing more (the tunnel is closing)."""
        self.closed = True
        self._queue.clear()

    def next_message(self) -> str | bytes | None:
        """What to put on the socket next, from the head of the queue (None: nothing queued)."""
        queue = self._queue
        if not queue:
            return None
        first = queue.popleft()
        if not self.batching or not queue:
            return p.encode(p.at_version(first, self.version))
        frames = [first]
        size = p.entry_size(first)
        while queue:
            following = p.entry_size(queue[0])
            if size + following > p.STREAM_BATCH_MAX_BYTES:
                break
            frames.append(queue.popleft())
            size += following
        if len(frames) == 1:  # the next one alone is larger than a batch
            return p.encode(p.at_version(first, self.version))
        try:
            return p.encode_stream_frames(frames, self.version)
        except p.ProtocolError:  # a value the binary layout cannot hold: these frames one by one, as before
            queue.extendleft(reversed(frames[1:]))
            return p.encode(p.at_version(first, self.version))

    async def run(self) -> None:
        """Write whatever is queued, as it is queued, until cancelled; a failed send ends the loop (raises)."""
        while not self.closed:
            message = self.next_message()
            if message is None:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await self._send(message)

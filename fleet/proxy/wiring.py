"""Plugs the proxy into the tunnel at app start: the tunnel answers streams opened elsewhere into pipes."""

from __future__ import annotations

from fleet.proxy import stream_pipes
from fleet.tunnel.streams_seam import StreamSink, register_stream_handler


class PipeStreamHandler:
    """The proxy's `fleet.tunnel.streams_seam.StreamHandler`: answers go into the stream's Redis list."""

    def reply_sink(self, pipe: str) -> StreamSink:
        """A writer to the Redis list `pipe` that the process which opened the stream reads."""
        return stream_pipes.PipeWriter(pipe)


def connect() -> None:
    """Called from `FleetConfig.ready()` (idempotent)."""
    register_stream_handler(PipeStreamHandler())

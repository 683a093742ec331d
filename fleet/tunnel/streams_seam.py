"""The tunnel's seam for byte streams: what it hands a stream's messages to, and who makes that for it.

A tunnel carries streams without knowing who proxies them. The agent's messages for one stream
(`stream.opened`, `stream.data`, `stream.window`, `stream.end`) go to a `StreamSink`: either the stream
object itself, when a request in this very process opened it (`LocalStream`, handed over in memory
through `fleet.tunnel.local_tunnels`), or the sink the registered `StreamHandler` makes for a stream
opened from another process (`stream.open` through the channel layer names where the answers go).

The proxy (`fleet.proxy`) registers its handler at app start (`fleet.proxy.wiring.connect`, called from
`FleetConfig.ready`); no module of the tunnel imports the proxy.
"""

from __future__ import annotations

from typing import Any, Protocol


class StreamSink(Protocol):
    """Where a tunnel hands the agent's messages for one stream, in order; `deliver` never waits."""

    def deliver(self, message: dict[str, Any]) -> None: ...


class LocalStream(StreamSink, Protocol):
    """A stream opened by a request in this process, handed to the tunnel in memory."""

    stream_id: int


class StreamHandler(Protocol):
    """What the tunnel needs from whoever proxies streams over it."""

    def reply_sink(self, pipe: str) -> StreamSink:
        """The sink back to the process whose `stream.open` named `pipe` (possibly on another replica)."""
        ...


_registry: dict[str, StreamHandler] = {}


def register_stream_handler(handler: StreamHandler) -> None:
    """Make `handler` the one the tunnel asks for the streams other processes open (the last one wins)."""
    _registry["handler"] = handler


def stream_handler() -> StreamHandler:
    """The registered handler; a `LookupError` if the app started without one."""
    handler = _registry.get("handler")
    if handler is None:
        raise LookupError("no stream handler registered with the tunnel (fleet.proxy.wiring.connect)")
    return handler

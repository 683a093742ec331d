"""The tunnel's seam for byte streams: what it hands a stream's messages to.

A tunnel carries streams without knowing who proxies them. Every stream is opened in the process that
holds the tunnel (`open_local_stream`, found through `fleet.tunnel.local_tunnels`): either by a request
there (the proxy's `TunnelStream` itself is the sink), or by another process over a peer link
(`fleet.tunnel.peer_serving.PeerSink` writes the messages back on the link). The agent's messages for
one stream (`stream.data`, `stream.window`, `stream.end`) go to that `StreamSink`, in order.

The proxy (`fleet.proxy`) opens streams through `local_tunnels` and peer links (`fleet.proxy.peer_dialer`);
no module of the tunnel imports the proxy.
"""

from __future__ import annotations

from typing import Any, Protocol


class StreamSink(Protocol):
    """Where a tunnel hands the agent's messages for one stream, in order; `deliver` never waits."""

    def deliver(self, message: dict[str, Any]) -> None: ...


class LocalStream(StreamSink, Protocol):
    """A stream opened at a tunnel of this process (by a request here, or over a peer link)."""

    stream_id: int

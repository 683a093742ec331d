"""The holding side of a peer link: streams other processes open to the tunnels this process holds.

An accepted link first proves it holds the peer key (`peer_wire`'s handshake; a wrong proof, a frame
larger than the handshake's (`PRE_AUTH_MAX_PAYLOAD`), or no proof within TUNNEL_PEER_HANDSHAKE_TIMEOUT_S
drops it). Then each OPEN names a node: if its tunnel is here
(`local_tunnels`) the stream is answered OPENED and handed to the tunnel consumer as a stream of this
process (`open_local_stream`) whose sink writes the agent's messages back on the link (`PeerSink`: DATA,
WINDOW, END frames, written with everything else of that loop turn); if not, NOT_HERE, and the opener
asks the database again. What the opener sends later (request bytes, credit, the end) reaches the
consumer in order, through one `Lane` per tunnel, so one tunnel's slow socket never holds up another's.

A link that drops ends every stream it carried at their agents (`stream.end` with an error).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

from fleet.tunnel import local_tunnels, peer_wire
from fleet.tunnel.peer_link import PeerLink
from kernel.metrics import PEER_CONNECTIONS_REFUSED

log = logging.getLogger("fleet.tunnel.peers")


class PeerSink:
    """A stream opened over a link, as the tunnel consumer sees it: its agent's messages go back on the link."""

    __slots__ = ("_link", "_served", "stream_id")

    def __init__(self, stream_id: int, link: PeerLink, served: ServedLink) -> None:
        self.stream_id = stream_id
        self._link = link
        self._served = served

    def deliver(self, message: dict[str, Any]) -> None:
        link, stream_id = self._link, self.stream_id
        if link.closed:
            return
        kind = message["type"]
        if kind == "stream.data":
            data = message["data"]
            if len(data) <= peer_wire.DATA_MAX:
                link.send(peer_wire.header(peer_wire.DATA, stream_id, len(data)), data)
            else:  # (an agent's chunks are far smaller; a frame over the reader's limit would drop the link)
                for start in range(0, len(data), peer_wire.DATA_MAX):
                    piece = data[start : start + peer_wire.DATA_MAX]
                    link.send(peer_wire.header(peer_wire.DATA, stream_id, len(piece)), piece)
        elif kind == "stream.window":
            link.send(peer_wire.window_frame(stream_id, int(message["increment"])))
        elif kind == "stream.end":
            self._served.forget(stream_id)
            link.send(peer_wire.end_frame(stream_id, message.get("error", "")))


class Lane:
    """Calls to one tunnel consumer from one link, awaited one after another by a task alive while there are any."""

    def __init__(self, on_idle: Callable[[], None]) -> None:
        self._calls: collections.deque[Callable[[], Awaitable[None]]] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._on_idle = on_idle

    def push(self, call: Callable[[], Awaitable[None]]) -> None:
        self._calls.append(call)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
            self._task.add_done_callback(_lane_done)

    async def _run(self) -> None:
        calls = self._calls
        while calls:
            try:
                await calls.popleft()()
            except Exception:  # the tunnel's socket broke: its close ends its streams; the others go on
                log.exception("peer link: handing a stream message to a tunnel failed")
        self._task = None
        self._on_idle()


def _lane_done(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("peer link lane ended by an unexpected error", exc_info=task.exception())


async def _open_at(tunnel: local_tunnels.LocalTunnel, opening: peer_wire.Opening, sink: PeerSink) -> None:
    """Open the stream at the tunnel, unless it closed since the OPEN arrived (then the stream ends)."""
    if local_tunnels.get(opening.node_id) is not tunnel:
        sink.deliver({"type": "stream.end", "error": "tunnel closed"})
        return
    try:
        await tunnel.open_local_stream(sink, opening.message())
    except Exception as exc:
        log.exception("peer link: opening stream %s at the tunnel of node %s failed", sink.stream_id, opening.node_id)
        sink.deliver({"type": "stream.end", "error": f"the tunnel could not open the stream: {exc}"})


class ServedLink:
    """The `LinkHandler` of an accepted link: the handshake, then the streams it opens here."""

    def __init__(self, key: bytes, on_settled: Callable[[PeerLink], None] | None = None) -> None:
        self._key = key
        self._on_settled = on_settled  # told once: the link authenticated, or went before it did
        self._refused = False
        self._dialer_nonce = b""
        self._listener_nonce = b""
        self.authenticated = False
        self._timer: asyncio.TimerHandle | None = None
        self._streams: dict[int, tuple[str, local_tunnels.LocalTunnel]] = {}  # stream id → (node id, tunnel)
        self._lanes: dict[str, Lane] = {}

    def start_handshake_timer(self, link: PeerLink) -> None:
        """Hold the link to the pre-handshake frame limit, and drop it unless it proves the key in time."""
        link.limit_payload(peer_wire.PRE_AUTH_MAX_PAYLOAD)
        timeout = settings.TUNNEL_PEER_HANDSHAKE_TIMEOUT_S
        self._timer = asyncio.get_running_loop().call_later(timeout, self._handshake_timed_out, link, timeout)

    def _handshake_timed_out(self, link: PeerLink, timeout: float) -> None:
        if not self.authenticated:
            log.warning("peer link from %s: no handshake within %ss; dropping it", link.name, timeout)
            self.refused("handshake_timeout")
            link.close("no handshake in time")

    def refused(self, reason: str) -> None:
        """Count this link as refused before its proof (once, whatever else happens to it)."""
        if not self._refused:
            self._refused = True
            PEER_CONNECTIONS_REFUSED.labels(reason).inc()

    def _settled(self, link: PeerLink) -> None:
        on_settled, self._on_settled = self._on_settled, None
        if on_settled is not None:
            on_settled(link)

    def forget(self, stream_id: int) -> None:
        self._streams.pop(stream_id, None)

    def frame_received(self, link: PeerLink, kind: int, stream_id: int, payload: bytes) -> None:
        if not self.authenticated:
            self._handshake(link, kind, payload)
            return
        if kind == peer_wire.DATA:
            self._to_tunnel(stream_id, {"type": "stream.data", "stream_id": stream_id, "data": payload})
        elif kind == peer_wire.WINDOW:
            increment = peer_wire.parse_window(payload)
            self._to_tunnel(stream_id, {"type": "stream.window", "stream_id": stream_id, "increment": increment})
        elif kind == peer_wire.END:
            error = payload.decode(errors="replace")
            self._to_tunnel(stream_id, {"type": "stream.end", "stream_id": stream_id, "error": error})
            if error:
                self.forget(stream_id)
        elif kind == peer_wire.OPEN:
            self._open(link, stream_id, peer_wire.parse_open(payload))
        else:
            raise peer_wire.PeerProtocolError(f"frame kind {kind} is not for the holding side")

    def _handshake(self, link: PeerLink, kind: int, payload: bytes) -> None:
        if kind == peer_wire.HELLO and not self._dialer_nonce:
            self._dialer_nonce = peer_wire.parse_hello(payload)
            self._listener_nonce = peer_wire.new_nonce()
            link.send(peer_wire.challenge_frame(self._key, self._dialer_nonce, self._listener_nonce))
        elif kind == peer_wire.PROOF and self._dialer_nonce:
            peer_wire.check_proof(self._key, self._dialer_nonce, self._listener_nonce, payload)
            self.authenticated = True
            link.limit_payload(peer_wire.MAX_PAYLOAD)
            if self._timer is not None:
                self._timer.cancel()
            self._settled(link)
        else:
            raise peer_wire.PeerProtocolError("handshake expected")

    def _open(self, link: PeerLink, stream_id: int, opening: peer_wire.Opening) -> None:
        if stream_id in self._streams:
            return
        tunnel = local_tunnels.get(opening.node_id)
        if tunnel is None:
            link.send(peer_wire.frame(peer_wire.NOT_HERE, stream_id))
            return
        self._streams[stream_id] = (opening.node_id, tunnel)
        link.send(peer_wire.frame(peer_wire.OPENED, stream_id))
        sink = PeerSink(stream_id, link, self)
        self._lane(opening.node_id).push(lambda: _open_at(tunnel, opening, sink))

    def _to_tunnel(self, stream_id: int, message: dict[str, Any]) -> None:
        entry = self._streams.get(stream_id)
        if entry is None:  # ended meanwhile (its END crossed this message)
            return
        node_id, tunnel = entry
        self._lane(node_id).push(lambda: tunnel.stream_message(message))

    def _lane(self, node_id: str) -> Lane:
        lane = self._lanes.get(node_id)
        if lane is None:
            lane = self._lanes[node_id] = Lane(lambda: self._lanes.pop(node_id, None))
        return lane

    def link_lost(self, link: PeerLink, reason: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if not self.authenticated and link.dropped_here:  # a wrong proof, junk, an oversized frame
            self.refused("handshake_failed")
        self._settled(link)
        streams, self._streams = self._streams, {}
        if streams:
            log.warning("peer link from %s lost (%s): ending its %d stream(s)", link.name, reason, len(streams))
        for stream_id, (node_id, tunnel) in streams.items():
            message = {"type": "stream.end", "stream_id": stream_id, "error": f"peer link lost: {reason}"}
            self._lane(node_id).push(lambda tunnel=tunnel, message=message: tunnel.stream_message(message))

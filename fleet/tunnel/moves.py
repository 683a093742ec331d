"""The tunnel consumer's moves (`fleet.tunnel.consumer.AgentTunnelConsumer`): a draining process asks its
agents to open a new tunnel elsewhere (`Move`, make-before-break; an agent too old for it reconnects once
its streams ended), a newly welcomed tunnel tells the node's older ones that it carries the node's work now,
and a retiring tunnel closes once no stream is left on it (`fleet.tunnel.drain` drives the moves)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

from agent import protocol as p
from fleet.groups import AGENTS_GROUP, NODE_SUPERSEDED, node_group
from fleet.tunnel import drain, local_tunnels

log = logging.getLogger("fleet.tunnel")

SUPERSEDED = (drain.CLOSE_MOVED, "tunnel moved")  # the close of a tunnel whose node's newer tunnel took over


class TunnelMoves:
    """Moving a node's tunnel to another process without a gap; mixed into the tunnel consumer, which holds
    the socket, its channel-layer name, its streams and its close."""

    node_id: UUID | None
    session: uuid.UUID
    protocol: int
    streams: dict[int, Any]
    channel_layer: Any
    channel_name: str
    _closing: asyncio.Future[None] | None = None
    _retiring: tuple[int, str] | None = None  # (close code, reason) once this tunnel is on its way out
    _send_frame: Callable[[p.Frame], Awaitable[None]]
    close: Callable[..., Awaitable[None]]

    async def _supersede_older_tunnels(self) -> None:
        """Tell the node's older tunnels (wherever they are) that this one now carries its work."""
        assert self.node_id is not None
        message = {"type": NODE_SUPERSEDED, "session": str(self.session)}
        try:
            await self.channel_layer.group_send(node_group(self.node_id), message)
        except Exception as exc:  # an old tunnel left behind closes at its next heartbeat check or drain
            log.warning("tunnel of node %s: telling older tunnels failed: %s", self.node_id, exc)

    async def node_superseded(self, message: dict[str, Any]) -> None:
        """`{"type": "node.superseded", "session": ...}`: a newer tunnel of this node was welcomed. Leave the
        node's groups (new commands and fan-outs go to the new one; the node row already names it) and
        close once the streams this tunnel carries ended."""
        if self.node_id is None or message.get("session") == str(self.session) or self._retiring == SUPERSEDED:
            return
        self._retiring = SUPERSEDED
        local_tunnels.discard(self.node_id, self)
        try:
            await self.channel_layer.group_discard(node_group(self.node_id), self.channel_name)
            await self.channel_layer.group_discard(AGENTS_GROUP, self.channel_name)
        except Exception as exc:
            log.warning("tunnel of node %s: leaving its groups failed: %s", self.node_id, exc)
        self._close_if_retired()

    @property
    def moved(self) -> bool:
        """A newer tunnel of the node was welcomed: this one carries none of its new work any more."""
        return self._retiring == SUPERSEDED

    async def drain_move(self, within_s: float) -> None:
        """This process drains (`fleet.tunnel.drain`): ask the agent to move within `within_s`; an agent
        too old for `Move` reconnects as before once this tunnel's streams ended."""
        if self._retiring is not None:
            return
        if self.protocol >= p.MOVE_SINCE:
            await self._send_frame(p.Move(within_s=within_s, reason="replica draining"))
            return
        self._retiring = (drain.CLOSE_SERVICE_RESTART, "replica draining; reconnect")
        self._close_if_retired()

    def _close_if_retired(self) -> None:
        """Close a retiring tunnel once no stream is left on it."""
        if self._retiring is not None and not self.streams and self._closing is None:
            code, reason = self._retiring
            self._closing = asyncio.ensure_future(self.close(code=code, reason=reason))

    def _stream_gone(self) -> None:
        """A stream of this tunnel ended: a retiring tunnel may close now."""
        if self._retiring is not None:
            self._close_if_retired()

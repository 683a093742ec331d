"""The tunnel consumer's heartbeats (`fleet.tunnel.consumer.AgentTunnelConsumer`): recorded (in batches with
other tunnels', `fleet.tunnel.records.HEARTBEATS`) and answered beside the data path, so stream frames behind a
heartbeat never wait for its database write; a node held as disconnected is told to reconnect."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable
from uuid import UUID

from django.core.exceptions import ValidationError
from django.db import DataError

from agent import protocol as p
from fleet.tunnel import records
from fleet.tunnel.moves import SUPERSEDED
from kernel import metrics

log = logging.getLogger("fleet.tunnel")


class TunnelHeartbeats:
    """Heartbeats of one tunnel, one after another; mixed into the tunnel consumer, which holds the socket,
    its close and its channel-layer groups."""

    node_id: UUID | None
    _beats: collections.deque[p.Heartbeat]
    _beat_task: asyncio.Future[None] | None = None
    _last_beat: float
    _closing: asyncio.Future[None] | None = None
    _retiring: tuple[int, str] | None = None
    _send_frame: Callable[[p.Frame], Awaitable[None]]
    _renew_groups: Callable[[], Awaitable[None]]
    close: Callable[..., Awaitable[None]]

    async def _on_heartbeat(self, frame: p.Heartbeat) -> None:
        """Record and answer the heartbeat beside the data path: stream frames behind it do not wait for
        its database write (the heartbeats of one tunnel are still recorded one after another)."""
        self._last_beat = time.monotonic()
        self._beats.append(frame)
        if self._beat_task is None or self._beat_task.done():
            self._beat_task = asyncio.ensure_future(self._answer_heartbeats())
            self._beat_task.add_done_callback(self._heartbeats_done)

    async def _answer_heartbeats(self) -> None:
        while self._beats:
            try:
                await self._record_heartbeat(self._beats.popleft())
            except (ValidationError, DataError, ValueError) as exc:  # as `receive` does for other frames
                log.warning("closing tunnel of node %s: bad heartbeat frame: %s", self.node_id, exc)
                self._beats.clear()
                await self.close(code=p.CLOSE_PROTOCOL_ERROR, reason="bad heartbeat frame")
                return

    def _heartbeats_done(self, task: asyncio.Future[None]) -> None:
        """An unexpected failure answering heartbeats closes the tunnel (the agent reconnects), logged."""
        if task.cancelled() or task.exception() is None:
            return
        log.error("tunnel of node %s: answering a heartbeat failed; closing", self.node_id, exc_info=task.exception())
        self._closing = asyncio.ensure_future(self.close(code=1011, reason="heartbeat failed"))

    async def _record_heartbeat(self, frame: p.Heartbeat) -> None:
        assert self.node_id is not None
        if self._retiring == SUPERSEDED:  # the node's newer tunnel records its presence
            await self._send_frame(p.HeartbeatAck(heartbeat_id=frame.id))
            return
        held_disconnected = await records.HEARTBEATS.submit((self.node_id, frame))
        metrics.observe_heartbeat_lag(frame.sent_at)
        if held_disconnected:
            log.warning("closing tunnel of node %s: the node is held as disconnected", self.node_id)
            await self.close(code=p.CLOSE_STALE, reason="node held as disconnected; reconnect")
            return
        await self._send_frame(p.HeartbeatAck(heartbeat_id=frame.id))
        await self._renew_groups()

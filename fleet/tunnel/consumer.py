"""The control-plane end of the agent tunnel (`/agent/tunnel`).

Authentication happens inside the socket, not through the user-session stack: the consumer signs the
agent's nonce with the CA key (so the agent can check its pinned CA), sends a `Challenge`, and accepts
only a `Hello` whose certificate our CA issued, is unrevoked, names this node, and whose signature over
the challenge nonce verifies with the certificate's key. Both signatures cover a context string plus the
nonce (`agent.protocol.server_proof_message` / `agent_proof_message`), never bytes a peer chose, and an
`agent_nonce` that is not 16-128 URL-safe characters is refused (4400) before anything is signed.
After that the socket joins the group `node.<uuid>`; Celery tasks reach it through the Redis channel
layer from any replica.

Every frame from the agent is validated by `agent.protocol.decode`; a malformed or oversized frame
closes this one socket with a reason (close code 4400) and never affects other sockets.

Heartbeats go ahead of stream data: the server queues a socket's messages for the consumer in arrival
order, and `HeartbeatFirst` takes a heartbeat out of that queue before the stream data that arrived
ahead of it; its database write then runs beside the data path (`_answer_heartbeats`), so neither
waits for the other. daphne reads a socket without bound, so its queue holds the whole backlog; uvicorn
stops reading while its queue is not empty, and `HeartbeatFirst` takes what it queued as it comes, so
the backlog reaches it there too (`fleet.tunnel.server_io`).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import logging
import re
import secrets
import time
import uuid
from typing import Any
from urllib.parse import parse_qs
from uuid import UUID

from channels.consumer import get_handler_name
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from channels.utils import await_many_dispatch
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import DataError

from agent import protocol as p
from fleet import agent_packages, agent_updates, ca, services
from fleet.groups import AGENTS_GROUP, command_frame, node_group
from fleet.models import Command
from fleet.tunnel import auth as tunnel_auth
from fleet.tunnel import drain, local_tunnels, peer_listener, records
from fleet.tunnel.handshakes import BUSY_REASON, HANDSHAKES, accepted_protocol_range, handshake_backoff_s
from fleet.tunnel.heartbeats import TunnelHeartbeats
from fleet.tunnel.moves import TunnelMoves
from fleet.tunnel.records import database_sync_to_async
from fleet.tunnel.revocations import REVOCATIONS
from fleet.tunnel.server_io import HeartbeatFirst, SendUntilClosed
from fleet.tunnel.stream_relay import StreamRelay
from kernel import draining, metrics
from kernel.exceptions import IllegalTransition

log = logging.getLogger("fleet.tunnel")


CLOSE_PROTOCOL_ERROR = p.CLOSE_PROTOCOL_ERROR
CLOSE_UNAUTHORIZED = p.CLOSE_UNAUTHORIZED
CLOSE_REVOKED = p.CLOSE_REVOKED
CLOSE_BACKOFF = p.CLOSE_BACKOFF
CLOSE_STALE = p.CLOSE_STALE
CLOSE_AGENT_TOO_OLD = p.CLOSE_AGENT_TOO_OLD


# A JSON `\u0000` escape preceded by an even number of backslashes (an odd one escapes the escape itself).
_NUL_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def without_nul(text: str) -> str:
    """A text frame with its JSON NUL escapes (`\\u0000`) dropped: PostgreSQL text and jsonb hold no NUL, so
    recording a result that carries one (a log tail read while written) would fail again at every resend."""
    return _NUL_ESCAPE.sub(r"\1", text) if "u0000" in text else text


class AgentTunnelConsumer(TunnelHeartbeats, TunnelMoves, StreamRelay, AsyncWebsocketConsumer):
    """One agent's tunnel: authenticate, then relay commands down and records frames up (and the proxied
    streams of the node both ways: `StreamRelay`, `fleet.tunnel.stream_relay`)."""

    node_id: UUID | None = None
    protocol = p.PROTOCOL_VERSION  # this tunnel's version: the highest both sides speak
    agent_protocol_max = p.PROTOCOL_VERSION
    inbox = ""  # this process's tunnel inbox, once authenticated
    _groups_joined = 0.0  # time.monotonic() of the last group_add of this tunnel's groups
    certificate_serial: str | None = None
    session: uuid.UUID | None = None  # this tunnel's id as recorded on the node (`Node.tunnel_session`)
    _relay_task: asyncio.Future[Any] | None = None
    _handshaking = False  # holds a place in HANDSHAKES (from connect until the welcome or the close)
    _registered = False  # in this process's registry (`local_tunnels`) and counted in TUNNELS_CONNECTED
    _ended = False  # `disconnect()` ran
    _relay_queue: asyncio.Queue[tuple[str, dict[str, Any]]]
    # Set when this tunnel is to close once its streams ended: (code, reason). A newer tunnel of the node
    # was welcomed (superseded: this one left the node's groups), or this process drains and the agent
    # cannot move (`fleet.tunnel.drain`).

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """As Channels' `AsyncConsumer.__call__`, with heartbeats taken ahead of queued stream data
        (`HeartbeatFirst`), nothing sent after the socket closed (`SendUntilClosed`), the channel layer's
        failures waited out underneath the open tunnel (`_channel_receive`), and a consumer that fails
        closed with 1011 after running its `disconnect()`: its streams end with an error at once, its
        node is disconnected and this process forgets it (nothing dead stays registered)."""
        self.scope = scope
        self.channel_layer = get_channel_layer(self.channel_layer_alias)
        self.channel_name = await self.channel_layer.new_channel()
        self.base_send = SendUntilClosed(send)
        try:
            await await_many_dispatch([HeartbeatFirst.over(receive) or receive, self._channel_receive], self.dispatch)
        except StopConsumer:
            pass
        except Exception:
            log.exception("tunnel of node %s failed; closing it", self.node_id)
            await self.disconnect(1011)
            with contextlib.suppress(Exception):
                await self.close(code=1011, reason="server error")

    async def _channel_receive(self) -> dict[str, Any]:
        """The next channel-layer message for this tunnel; the layer failing (Redis restarting) is waited
        out underneath the open socket (`local_tunnels.receive_through_failures`)."""
        return await local_tunnels.receive_through_failures(self.channel_layer, self.channel_name, self.node_id)

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Route a message to its handler, without Channels' `close_old_connections` hop per message.

        `AsyncConsumer.dispatch` runs `close_old_connections` on daphne's one sync thread before every
        message; with hundreds of tunnels every frame queued behind the others on that thread. All ORM
        work of this consumer goes through `database_sync_to_async`, which cleans up around each call.
        """
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def connect(self) -> None:
        self.streams = {}
        self._beats = collections.deque()
        self.nonce = secrets.token_hex(32)  # set first: a hello racing a refusal below cannot verify
        await self.accept()
        if draining.is_draining():  # this replica stops: the agent's next try goes to another one
            await self._send_frame(p.Backoff(retry_after_s=1.0, reason="replica draining"))
            await self.close(code=CLOSE_BACKOFF, reason="draining")
            return
        if not HANDSHAKES.enter(settings.AGENT_MAX_HANDSHAKES):
            retry_after = handshake_backoff_s()
            await self._send_frame(p.Backoff(retry_after_s=retry_after, reason=BUSY_REASON))
            await self.close(code=CLOSE_BACKOFF, reason="busy")
            return
        self._handshaking = True
        try:
            await self._challenge()
        except BaseException:  # cancelled (the socket went away) or failed: the place is free again
            self._handshake_done()
            raise

    async def _challenge(self) -> None:
        """Check the agent's query (nonce, protocol range) and send the signed challenge."""
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        agent_nonce = (query.get("agent_nonce") or [""])[0]
        if not p.is_valid_nonce(agent_nonce):  # the CA key signs nothing but a well-formed nonce
            await self.close(code=CLOSE_PROTOCOL_ERROR, reason="agent_nonce must be 16-128 URL-safe characters")
            return
        # The agent's protocol range; an agent that does not say speaks version 1 (it predates ranges).
        agent_range = p.parse_version_range((query.get("protocol") or ["1"])[0])
        if agent_range is None:
            await self.close(code=CLOSE_PROTOCOL_ERROR, reason="protocol must be <min>-<max>")
            return
        version = p.negotiate((p.MIN_PROTOCOL_VERSION, p.PROTOCOL_VERSION), agent_range)
        if version is None:
            if agent_range[1] < p.MIN_PROTOCOL_VERSION:
                need = p.MIN_PROTOCOL_VERSION
                reason = f"agent protocol {agent_range[1]} too old (need {need}+): re-run the install script"
                await self.close(code=CLOSE_AGENT_TOO_OLD, reason=reason)
            else:
                reason = f"this control plane speaks protocol {p.PROTOCOL_VERSION}"
                await self.close(code=CLOSE_PROTOCOL_ERROR, reason=reason)
            return
        self.protocol = version
        self.agent_protocol_max = agent_range[1]
        server_signature = await database_sync_to_async(tunnel_auth.server_proof)(agent_nonce)
        challenge = p.Challenge(nonce=self.nonce, server_signature_b64=base64.b64encode(server_signature).decode())
        await self._send_frame(challenge)
        self._hello_timer = asyncio.ensure_future(self._close_if_silent())

    async def _close_if_silent(self) -> None:
        await asyncio.sleep(settings.AGENT_HELLO_TIMEOUT_S)
        if self.node_id is None:
            await self.close(code=CLOSE_UNAUTHORIZED, reason="no hello received")

    def _handshake_done(self) -> None:
        """Give this tunnel's place in HANDSHAKES back (once)."""
        if self._handshaking:
            self._handshaking = False
            HANDSHAKES.leave()

    async def disconnect(self, code: int) -> None:
        """The socket closed (or the consumer failed): free what it held, once."""
        if self._ended:
            return
        self._ended = True
        self._handshake_done()
        drain.closed(self)
        REVOCATIONS.discard(self)
        for task in (getattr(self, "_hello_timer", None), self._relay_task, self._beat_task, self._outbox_task):
            if task is not None:
                task.cancel()
        if self._outbox is not None:
            self._outbox.close()
        if self.node_id is not None:
            # The database first: when many sockets drop at once (a partition, a deploy) Redis may
            # refuse some of the clean-up below, and the node must not stay "connected" because of it.
            # (A superseded tunnel's close changes nothing: the node's row names the newer one.)
            local_tunnels.discard(self.node_id, self)
            if self._registered:
                self._registered = False
                metrics.TUNNELS_CONNECTED.dec()
            await database_sync_to_async(services.node_disconnected)(node=self.node, session=self.session)
        try:
            for stream_id in list(self.streams):
                await self._to_stream(stream_id, {"type": "stream.end", "error": "tunnel closed"})
            if self.node_id is not None:
                await self.channel_layer.group_discard(node_group(self.node_id), self.channel_name)
                await self.channel_layer.group_discard(AGENTS_GROUP, self.channel_name)
        except Exception as exc:  # stale group entries expire; a message sent to them is dropped unread
            log.warning("tunnel of node %s: channel-layer clean-up failed: %s", self.node_id, exc)
        finally:
            self.streams.clear()

    # ---- frames from the agent

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        raw = without_nul(text_data) if text_data is not None else (bytes_data or b"")
        try:
            frame = p.decode(raw)
        except p.ProtocolError as exc:
            log.warning("closing tunnel of node %s: %s", self.node_id, exc)
            await self.close(code=CLOSE_PROTOCOL_ERROR, reason=str(exc)[:120])
            return
        if self.node_id is None:
            if not isinstance(frame, p.Hello):
                await self.close(code=CLOSE_UNAUTHORIZED, reason="hello expected first")
                return
            if frame.v != self.protocol:
                await self.close(code=CLOSE_PROTOCOL_ERROR, reason=f"hello must be protocol {self.protocol}")
                return
            try:
                await self._on_hello(frame)
            finally:
                self._handshake_done()
            return
        handler = self._handlers.get(type(frame))
        if handler is None:
            log.debug("node %s sent unexpected %s frame", self.node_id, frame.TYPE)
            return
        try:
            await handler(self, frame)
        except IllegalTransition as exc:  # e.g. a late ack for a command that already finished
            log.info("node %s: %s frame ignored: %s", self.node_id, frame.TYPE, exc)
        except (ValidationError, DataError, ValueError) as exc:  # well-formed JSON, values we cannot take
            log.warning("closing tunnel of node %s: bad %s frame: %s", self.node_id, frame.TYPE, exc)
            await self.close(code=CLOSE_PROTOCOL_ERROR, reason=f"bad {frame.TYPE} frame"[:120])
        except Exception:  # recording it failed (the database: a deadlock, a lost connection)
            # Closed, so that the agent says hello again and every unfinished command is sent again (its
            # journal answers those it finished): nothing it reported is lost, nothing dead stays here.
            log.exception("closing tunnel of node %s: recording its %s frame failed", self.node_id, frame.TYPE)
            await self.disconnect(1011)  # at once: nothing is routed to this tunnel any more
            await self.close(code=1011, reason=f"recording a {frame.TYPE} frame failed; reconnect"[:120])

    async def _on_hello(self, hello: p.Hello) -> None:
        try:
            serial = tunnel_auth.certificate_serial(hello.certificate_pem)
        except ValueError:
            await self.close(code=CLOSE_UNAUTHORIZED, reason="unreadable certificate")
            return
        if await database_sync_to_async(tunnel_auth.is_serial_revoked)(serial):
            await self._send_frame(p.Revoked(reason="certificate revoked"))
            await self.close(code=CLOSE_REVOKED, reason="certificate revoked")
            return
        try:
            certificate_node_id = await database_sync_to_async(ca.verify_node_certificate)(hello.certificate_pem)
            ca.verify_signature(
                certificate_pem=hello.certificate_pem,
                data=p.agent_proof_message(self.nonce),
                signature=base64.b64decode(hello.signature_b64, validate=True),
            )
            if str(certificate_node_id) != hello.node_id:
                raise ca.CertificateRejected("certificate does not belong to this node")
        except (ca.CertificateRejected, ValueError) as exc:
            log.warning("refusing tunnel: %s", exc)
            await self.close(code=CLOSE_UNAUTHORIZED, reason=str(exc)[:120])
            return
        accepted = accepted_protocol_range()
        if self.protocol < accepted[0]:
            # Authenticated, so the refusal goes on the node's own event log; the agent gets the same words.
            refusal = await database_sync_to_async(services.node_agent_refused)(
                node_id=certificate_node_id, protocol_version=self.protocol, accepted=accepted
            )
            log.warning("refusing tunnel of node %s: %s", certificate_node_id, refusal)
            reason = f"agent protocol {self.protocol} too old (need {accepted[0]}+): re-run the install script"
            await self.close(code=CLOSE_AGENT_TOO_OLD, reason=reason)
            return
        self.inbox = await local_tunnels.inbox()
        peer = await _peer_address()
        self.session = uuid.uuid4()
        node = await database_sync_to_async(records.connect_node)(
            certificate_node_id, hello, self.inbox, peer, self.session, self.protocol
        )
        if node is None:
            await self._send_frame(p.Revoked(reason="node no longer exists"))
            await self.close(code=CLOSE_REVOKED, reason="node deleted")
            return
        self.node = node
        self.node_id = node.id
        self.certificate_serial = serial
        self._last_beat = time.monotonic()
        self._hello_timer.cancel()
        current = agent_packages.served_version()
        mode_settings = await database_sync_to_async(node.cluster.mode_settings)()
        # The Welcome first: until the agent has it, it takes no other frame ("expected welcome, got
        # command" drops the tunnel). Nothing can reach this socket before: it joins the node's groups
        # (commands, fan-outs) and the process's registry (streams) only after the Welcome went out.
        await self._send_frame(
            p.Welcome(
                node_id=str(node.id),
                heartbeat_interval_s=settings.AGENT_HEARTBEAT_INTERVAL_S,
                mode=node.cluster.mode,
                mode_settings=mode_settings,
                agent_version_current=current,
                update_required=self.protocol < p.PROTOCOL_VERSION or node.agent_version != current,
            )
        )
        local_tunnels.add(node.id, self)
        self._registered = True
        metrics.TUNNELS_CONNECTED.inc()
        REVOCATIONS.add(self)
        try:
            await self.join_groups()
        except Exception as exc:  # Redis away: joined once it answers (the pending commands follow anyway)
            log.warning("tunnel of node %s: joining its channel-layer groups failed: %s", self.node_id, exc)
            local_tunnels.layer_failed()
        drain.opened(self)
        await self._supersede_older_tunnels()
        await self.send_pending_commands()
        if self.protocol >= agent_updates.UPDATABLE_FROM_PROTOCOL and node.cluster.auto_update_agents:
            # After the welcome: building the package the first time must not hold up the handshake.
            await database_sync_to_async(agent_updates.node_auto_update)(node=node)

    async def send_pending_commands(self) -> None:
        """Send the node's unfinished commands: at hello, and again once the channel layer is back after it
        lost the groups (a command sent to the node's group meanwhile reached no socket). The agent runs
        each key once: one already running is only acknowledged again, one done sends its outcome again."""
        node = self.node
        for command in await database_sync_to_async(services.command_pending_for_node)(node=node):
            await self._send_command(command)
            if command.status == "queued":
                await database_sync_to_async(services.command_record_delivered)(node=node, command_id=command.id)

    async def join_groups(self) -> None:
        """Join (again: it renews the membership) this node's group and the agents' group."""
        assert self.node_id is not None
        await self.channel_layer.group_add(node_group(self.node_id), self.channel_name)
        await self.channel_layer.group_add(AGENTS_GROUP, self.channel_name)
        self._groups_joined = time.monotonic()

    async def _renew_groups(self) -> None:
        """On a heartbeat, renew the group memberships once TUNNEL_GROUP_REFRESH_S has passed.

        Redis drops a membership after channels_redis's group_expiry (a day) and loses it with its keys
        (a flush, a restart without persistence); a command sent to the node's group then reaches no
        socket, and no resend helps. Redis away: the next heartbeat tries again.
        """
        if time.monotonic() - self._groups_joined < settings.TUNNEL_GROUP_REFRESH_S:
            return
        try:
            await self.join_groups()
        except Exception as exc:
            log.warning("tunnel of node %s: renewing its channel-layer groups failed: %s", self.node_id, exc)

    async def _on_ack(self, frame: p.Ack) -> None:
        assert self.node_id is not None
        await records.REPORTS.submit(
            services.CommandReport.ack(self.node_id, frame.command_id, duplicate=frame.duplicate)
        )

    async def _on_progress(self, frame: p.Progress) -> None:
        await database_sync_to_async(services.command_record_progress)(
            node=self.node,
            command_id=frame.command_id,
            message=frame.message,
            percent=frame.percent,
            data=frame.data,
        )

    async def _on_result(self, frame: p.Result) -> None:
        assert self.node_id is not None
        await records.REPORTS.submit(services.CommandReport.result(self.node_id, frame.command_id, frame.data))

    async def _on_error(self, frame: p.Error) -> None:
        assert self.node_id is not None
        report = services.CommandReport.error(
            self.node_id, frame.command_id, code=frame.code, message=frame.message, data=frame.data
        )
        await records.REPORTS.submit(report)

    async def _on_inventory(self, frame: p.InventoryReport) -> None:
        await database_sync_to_async(records.record_inventory)(self.node_id, frame.inventory)

    _handlers: dict[type, Any] = {
        p.Heartbeat: TunnelHeartbeats._on_heartbeat,
        p.Ack: _on_ack,
        p.Progress: _on_progress,
        p.Result: _on_result,
        p.Error: _on_error,
        p.InventoryReport: _on_inventory,
        **StreamRelay.STREAM_HANDLERS,
    }

    # ---- messages from the channel layer (any replica, any Celery worker)

    async def node_command(self, message: dict[str, Any]) -> None:
        """`{"type": "node.command", "command_id": ..., "frame"?: ...}`: forward that command to the agent."""
        if self.node_id is None:
            return
        if message.get("frame"):  # encoded by the dispatcher (a command without secrets)
            frame = message["frame"]
            if self.protocol != p.PROTOCOL_VERSION:  # an agent one version behind: its version's encoding
                frame = p.encode(p.at_version(p.decode(frame), self.protocol))
            await self.send(text_data=frame)
            return
        command = await database_sync_to_async(records.load_command)(self.node_id, message["command_id"])
        if command is not None:
            await self._send_command(command)

    async def node_revoke(self, message: dict[str, Any]) -> None:
        """`{"type": "node.revoke"}`: the node was deleted; tell the agent and close within the second."""
        with contextlib.suppress(Exception):
            await self._send_frame(p.Revoked(reason=message.get("reason", "node deleted")))
        await self.close(code=CLOSE_REVOKED, reason="revoked")

    async def node_silent(self, message: dict[str, Any]) -> None:
        """`{"type": "node.silent", "silent_s": N}`: the beat marked the node lost; close this socket so the
        agent reconnects, unless it carried a hello or heartbeat within the last N/2 s (a newer tunnel)."""
        if self.node_id is None or time.monotonic() - self._last_beat < float(message.get("silent_s", 0)) / 2:
            return
        log.warning("closing tunnel of node %s: no heartbeat through it, the node was marked lost", self.node_id)
        await self.close(code=CLOSE_STALE, reason="no heartbeat; reconnect")

    async def agents_backoff(self, message: dict[str, Any]) -> None:
        """`{"type": "agents.backoff", "retry_after_s": N}`: ask the agent to reconnect later (deploys)."""
        await self._send_frame(
            p.Backoff(retry_after_s=float(message["retry_after_s"]), reason=message.get("reason", ""))
        )
        await self.close(code=CLOSE_BACKOFF, reason="backoff")

    # ---- helpers

    async def _send_command(self, command: Command) -> None:
        await self._send_frame(command_frame(command))

    async def _send_frame(self, frame: p.Frame) -> None:
        await self._send_message(p.encode(p.at_version(frame, self.protocol)))

    async def _send_message(self, encoded: str | bytes) -> None:
        if isinstance(encoded, bytes):
            await self.send(bytes_data=encoded)
        else:
            await self.send(text_data=encoded)


async def _peer_address() -> str:
    """This process's peer address (its listener started on first use); "" (logged) if none could start:
    the tunnel then serves streams of its own process only."""
    try:
        return await peer_listener.address()
    except OSError:
        log.exception("no peer listener: other processes cannot open streams to the tunnels of this one")
        return ""

"""Admission of tunnels while they authenticate: a bounded number of handshakes per process, a Backoff for
the rest (from `HandshakeAdmission`, before any consumer exists), and the protocol versions accepted."""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import parse_qs

from django.conf import settings

from agent import protocol as p


class HandshakeGate:
    """How many tunnels of this process are between connect and welcome; admits up to a limit.

    Each handshake costs a CA signature, a certificate check and several queries on the thread pool.
    When thousands of agents dial at once (a deploy, a restart of the control plane) and every one is
    let in, the handshakes queue in the process until the agents' opening timeout (10 s) passes; they
    retry within seconds, and the work done for the abandoned ones is lost: the process stays busy and
    almost nobody connects. Refusing the excess at once with a Backoff keeps the queue short.
    """

    def __init__(self) -> None:
        self.open = 0

    def enter(self, limit: int) -> bool:
        """Take a place if fewer than `limit` are taken; False when full."""
        if self.open >= limit:
            return False
        self.open += 1
        return True

    def leave(self) -> None:
        self.open = max(0, self.open - 1)


HANDSHAKES = HandshakeGate()


# Allowed, within the offline grace, for an agent's first reconnect delay (under a second) and the handshake
# that follows its Backoff (connect, challenge, hello recorded).
HANDSHAKE_ALLOWANCE_S = 2.0
SHORTEST_BACKOFF_S = 0.5


def handshake_backoff_range() -> tuple[float, float]:
    """The shortest and the longest Backoff a full `HANDSHAKES` sends, derived from NODE_OFFLINE_GRACE_S.

    The longest, stretched by the agent's jitter (`protocol.BACKOFF_JITTER`) and followed by a handshake
    (`HANDSHAKE_ALLOWANCE_S`), ends within the grace: an agent refused right after its tunnel closed (a
    deploy, a restart) is back before its node would read offline. The shortest is a third of it, so the
    refused crowd comes back spread over the window (grace 10 s: 2.2-6.7 s, 8 s with the agent's jitter).
    """
    room = settings.NODE_OFFLINE_GRACE_S - HANDSHAKE_ALLOWANCE_S
    longest = max(SHORTEST_BACKOFF_S, room / (1 + p.BACKOFF_JITTER))
    return max(SHORTEST_BACKOFF_S, longest / 3), longest


def handshake_backoff_s() -> float:
    """How long an agent refused by a full `HANDSHAKES` waits: anywhere in `handshake_backoff_range()`."""
    shortest, longest = handshake_backoff_range()
    return shortest + (longest - shortest) * secrets.randbelow(1001) / 1000


BUSY_REASON = "control plane busy: too many agents connecting"


def busy_backoff_frame(query_string: bytes) -> str | bytes:
    """The Backoff frame for a refused tunnel, at the version that tunnel would have spoken."""
    query = parse_qs(query_string.decode("latin-1"))
    agent_range = p.parse_version_range((query.get("protocol") or ["1"])[0])
    version = p.negotiate((p.MIN_PROTOCOL_VERSION, p.PROTOCOL_VERSION), agent_range) if agent_range else None
    frame = p.Backoff(retry_after_s=handshake_backoff_s(), reason=BUSY_REASON)
    return p.encode(p.at_version(frame, version or p.PROTOCOL_VERSION))


class HandshakeAdmission:
    """ASGI wrapper of the tunnel consumer: while `HANDSHAKES` is full, a new tunnel gets its Backoff
    from here, without a consumer (no channel-layer subscription, nothing for daphne to shut down)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket" or HANDSHAKES.open < settings.AGENT_MAX_HANDSHAKES:
            await self.app(scope, receive, send)
            return
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        encoded = busy_backoff_frame(scope.get("query_string", b""))
        await send(
            {"type": "websocket.send", **({"bytes": encoded} if isinstance(encoded, bytes) else {"text": encoded})}
        )
        await send({"type": "websocket.close", "code": p.CLOSE_BACKOFF, "reason": "busy"})


def accepted_protocol_range() -> tuple[int, int]:
    """The agent protocol versions this control plane takes: from AGENT_PROTOCOL_MIN (default: one
    version behind this release) to this release's own."""
    low = max(p.MIN_PROTOCOL_VERSION, min(int(settings.AGENT_PROTOCOL_MIN or 0), p.PROTOCOL_VERSION))
    return low, p.PROTOCOL_VERSION

"""This process's peer listener: other control-plane processes reach the tunnels it holds through it.

Started lazily in the running event loop (daphne's asyncio reactor or uvicorn's uvloop alike), before a
tunnel records itself on its node row (`address()` is what the tunnel writes as `Node.tunnel_peer`), on
TUNNEL_PEER_BIND, port TUNNEL_PEER_PORT (0: one the system picks; otherwise the first free one of the
TUNNEL_PEER_PORT_COUNT ports from there, so several web processes of one machine each get one), and
advertised as TUNNEL_PEER_ADVERTISE (default: the bind address, or this host's address when binding every
interface). A link is served only once the dialer proved it holds the peer key (`peer_wire`); streams
it opens are served by `fleet.tunnel.peer_serving`.

What an unauthenticated connection can make this process hold is bounded: frames of the handshake's size
(`peer_wire.PRE_AUTH_MAX_PAYLOAD`), for TUNNEL_PEER_HANDSHAKE_TIMEOUT_S, and at most
TUNNEL_PEER_MAX_PENDING such connections at once: one more is closed as soon as it is accepted (the links
already proven are never counted, so a flood of connections cannot drop the tunnels' streams).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
import weakref
from typing import Any

from django.conf import settings

from fleet.tunnel import peer_wire
from fleet.tunnel.peer_link import PeerLink
from fleet.tunnel.peer_serving import ServedLink

log = logging.getLogger("fleet.tunnel.peers")

_WILDCARDS = frozenset({"", "0.0.0.0", "::"})

_state: dict[str, Any] = {"loop": None, "server": None, "address": "", "starting": None}
_accepted: weakref.WeakSet[PeerLink] = weakref.WeakSet()  # links accepted and not yet gone
_pending: set[PeerLink] = set()  # accepted links that have not proven the key yet
_refused = {"count": 0, "logged_at": -1e9}
_REFUSAL_LOG_EVERY_S = 10.0


def advertised_host(bind: str) -> str:
    """The host other processes dial: TUNNEL_PEER_ADVERTISE, else the bind address, else (binding every
    interface) the address this host's name resolves to (a container's address on its network), or, where
    that is a loopback address (Debian maps the host name to 127.0.1.1), the default route's interface's."""
    if settings.TUNNEL_PEER_ADVERTISE:
        return settings.TUNNEL_PEER_ADVERTISE
    if bind not in _WILDCARDS:
        return bind
    host = socket.gethostbyname(socket.gethostname())
    if ipaddress.ip_address(host).is_loopback:
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: it only picks the outgoing interface
            host = probe.getsockname()[0]
    if ipaddress.ip_address(host).is_loopback:
        log.warning("peer listener binds every interface but can only advertise %s: set TUNNEL_PEER_ADVERTISE", host)
    return host


def current_address() -> str:
    """This process's advertised peer address if its listener runs in the running loop, else ""."""
    server = _state["server"]
    loop = asyncio.get_running_loop()
    if _state["loop"] is loop and server is not None and server.is_serving():
        return _state["address"]
    return ""


async def address() -> str:
    """This process's advertised peer address (`host:port`), starting the listener on first use.

    Raises `OSError` when no port could be bound; the caller logs it (its tunnel then serves only
    streams of its own process).
    """
    known = current_address()
    if known:
        return known
    loop = asyncio.get_running_loop()
    starting = _state["starting"]
    if starting is None or _state["loop"] is not loop:
        _stop_old()
        _state.update(loop=loop, server=None, address="", starting=loop.create_future())
        starting = _state["starting"]
        try:
            server, port = await _bind()
        except BaseException as exc:
            _state["starting"] = None
            starting.set_exception(exc)
            starting.exception()  # (retrieved: only waiters re-raise it)
            raise
        _state.update(server=server, address=peer_wire.format_address(advertised_host(settings.TUNNEL_PEER_BIND), port))
        _state["starting"] = None
        starting.set_result(None)
        log.info("peer listener on %s:%s, advertised as %s", settings.TUNNEL_PEER_BIND, port, _state["address"])
        return _state["address"]
    await starting
    return _state["address"]


async def _bind() -> tuple[asyncio.Server, int]:
    loop = asyncio.get_running_loop()
    bind, first = settings.TUNNEL_PEER_BIND, settings.TUNNEL_PEER_PORT
    ports = [0] if first == 0 else range(first, first + max(1, settings.TUNNEL_PEER_PORT_COUNT))
    error: OSError | None = None
    for port in ports:
        try:
            server = await loop.create_server(_accept, bind or None, port, backlog=1024)
        except OSError as exc:
            error = exc
            continue
        return server, server.sockets[0].getsockname()[1]
    raise OSError(f"no free peer port on {bind} from {first} ({len(ports)} tried): {error}")


class _AcceptedLink(PeerLink):
    """A link this listener accepted: admitted while fewer than TUNNEL_PEER_MAX_PENDING wait for their
    handshake, else closed at once."""

    handler: ServedLink

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if len(_pending) >= settings.TUNNEL_PEER_MAX_PENDING:
            _refused["count"] += 1
            now = time.monotonic()
            if now - _refused["logged_at"] >= _REFUSAL_LOG_EVERY_S:
                _refused["logged_at"] = now
                log.warning(
                    "peer listener: %d handshakes pending (TUNNEL_PEER_MAX_PENDING); closing new connections "
                    "(%d so far, the latest from %s)",
                    len(_pending),
                    _refused["count"],
                    self.name,
                )
            self.handler.refused("pending_cap")
            self.close("too many pending handshakes")
            return
        _pending.add(self)
        self.handler.start_handshake_timer(self)


def _accept() -> PeerLink:
    link = _AcceptedLink(ServedLink(peer_wire.link_key(), on_settled=_pending.discard))
    _accepted.add(link)
    return link


def pending() -> int:
    """How many accepted connections are waiting for their handshake now."""
    return len(_pending)


def stop() -> None:
    """Stop listening and drop every accepted link (their streams end at their agents). Tests, shutdown."""
    for link in list(_accepted):
        link.close("the listener stopped")
    _pending.clear()
    _stop_old()
    _state.update(loop=None, server=None, address="", starting=None)


def _stop_old() -> None:
    """Close the listener of an earlier event loop (tests run one loop after another)."""
    server = _state["server"]
    if server is not None:
        with contextlib.suppress(Exception):
            for sock in server.sockets:
                sock.close()
        with contextlib.suppress(Exception):
            server.close()

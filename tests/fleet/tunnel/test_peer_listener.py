"""This process's peer listener: which port it takes, which address it advertises, one per event loop."""

from __future__ import annotations

import asyncio
import socket

import pytest

from fleet.tunnel import peer_listener, peer_wire
from kernel.metrics import PEER_CONNECTIONS_REFUSED
from tests.support.processes import free_port


def _taken(port: int) -> socket.socket:
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", port))
    holder.listen()
    return holder


def _free_run(count: int) -> int:
    """The first of `count` consecutive free ports."""
    while True:
        first = free_port()
        if first + count < 65535 and all(_is_free(port) for port in range(first, first + count)):
            return first


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_a_fixed_port_taken_by_another_web_process_moves_the_listener_to_the_next(settings):
    first = _free_run(3)
    settings.TUNNEL_PEER_PORT, settings.TUNNEL_PEER_PORT_COUNT = first, 3
    taken = _taken(first)  # the machine's first web process holds it

    async def scenario() -> str:
        try:
            return await peer_listener.address()
        finally:
            peer_listener.stop()

    try:
        assert asyncio.run(scenario()) == f"127.0.0.1:{first + 1}"
    finally:
        taken.close()


def test_no_free_port_in_the_range_is_an_error_not_a_silent_listener_elsewhere(settings):
    first = _free_run(2)
    settings.TUNNEL_PEER_PORT, settings.TUNNEL_PEER_PORT_COUNT = first, 2
    taken = [_taken(first), _taken(first + 1)]

    async def scenario() -> None:
        try:
            await peer_listener.address()
        finally:
            peer_listener.stop()

    try:
        with pytest.raises(OSError, match="no free peer port"):
            asyncio.run(scenario())
    finally:
        for holder in taken:
            holder.close()


def test_the_listener_belongs_to_its_event_loop_and_concurrent_callers_share_it():
    async def scenario() -> tuple[list[str], str]:
        addresses = await asyncio.gather(*(peer_listener.address() for _ in range(5)))
        return addresses, peer_listener.current_address()

    first, current = asyncio.run(scenario())
    assert len(set(first)) == 1
    assert current == first[0]
    old = peer_listener._state["server"]
    second, _ = asyncio.run(scenario())  # a new loop: a new listener, the old one closed
    assert peer_listener._state["server"] is not old
    assert peer_listener._state["address"] == second[0]
    if second[0] != first[0]:  # (the system may hand the same free port out again)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(peer_wire.parse_address(first[0]), timeout=2).close()
    asyncio.run(_stop())


async def _stop() -> None:
    peer_listener.stop()


@pytest.mark.parametrize(
    ("advertise", "bind", "resolved", "expected"),
    [
        ("10.0.0.5", "0.0.0.0", "10.9.9.9", "10.0.0.5"),  # TUNNEL_PEER_ADVERTISE wins (Kubernetes: the pod IP)
        ("", "10.1.2.3", "10.9.9.9", "10.1.2.3"),  # a bind address is reachable as it is
        ("", "0.0.0.0", "10.9.9.9", "10.9.9.9"),  # every interface: what the host name resolves to
    ],
)
def test_the_advertised_address(settings, monkeypatch, advertise, bind, resolved, expected):
    settings.TUNNEL_PEER_ADVERTISE = advertise
    monkeypatch.setattr(peer_listener.socket, "gethostbyname", lambda name: resolved)
    assert peer_listener.advertised_host(bind) == expected


# ---- what an unauthenticated connection can make the process hold


async def _connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = peer_wire.parse_address(await peer_listener.address())
    return await asyncio.open_connection(host, port)


async def _closed(reader: asyncio.StreamReader) -> bool:
    """Wait until the listener closes the connection: True, or TimeoutError when it is still open after 5 s
    (a bound, not a measurement: the tests that need a close "at once" set the handshake deadline to 600 s,
    and the listener closed such connections only at its 10 s deadline before it had limits)."""
    try:
        await asyncio.wait_for(reader.read(), 5)  # whatever was sent before, then the end
    except ConnectionResetError:  # (closed with unread bytes: a reset)
        return True
    return reader.at_eof()


async def _prove_the_key(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    nonce = peer_wire.new_nonce()
    writer.write(peer_wire.hello_frame(nonce))
    kind, _, size = peer_wire.HEADER.unpack(await reader.readexactly(peer_wire.HEADER.size))
    assert kind == peer_wire.CHALLENGE
    listener_nonce = peer_wire.check_challenge(peer_wire.link_key(), nonce, await reader.readexactly(size))
    writer.write(peer_wire.proof_frame(peer_wire.link_key(), nonce, listener_nonce))
    await writer.drain()


def _refused(reason: str) -> float:
    return PEER_CONNECTIONS_REFUSED.labels(reason)._value.get()


async def _until_pending(count: int) -> None:
    while peer_listener.pending() != count:
        await asyncio.sleep(0.01)


def test_a_frame_larger_than_the_handshakes_is_refused_before_the_key_is_proven(settings):
    """Announcing a megabyte (the post-handshake limit) before the proof drops the connection at its header,
    long before the handshake's deadline: nothing of it is buffered."""
    settings.TUNNEL_PEER_HANDSHAKE_TIMEOUT_S = 600

    async def scenario() -> tuple[bool, bool]:
        try:
            reader, writer = await _connect()
            writer.write(peer_wire.header(peer_wire.HELLO, 0, peer_wire.MAX_PAYLOAD) + b"x" * 1000)
            oversized = await _closed(reader)
            writer.close()
            # a proven link takes frames up to the full limit in the same bytes as its proof
            reader, writer = await _connect()
            await _prove_the_key(reader, writer)
            writer.write(peer_wire.frame(peer_wire.WINDOW, 7, b"\0" * 8) + peer_wire.header(peer_wire.DATA, 7, 70_000))
            writer.write(b"d" * 70_000)
            await writer.drain()
            await _until_pending(0)
            proven_open = not reader.at_eof()
            writer.close()
            return oversized, proven_open
        finally:
            peer_listener.stop()

    before = _refused("handshake_failed")
    assert asyncio.run(scenario()) == (True, True)
    assert _refused("handshake_failed") == before + 1  # the oversized one; the proven link not
    assert peer_wire.PRE_AUTH_MAX_PAYLOAD < 1024


def test_a_connection_that_does_not_prove_the_key_in_time_is_dropped(settings):
    settings.TUNNEL_PEER_HANDSHAKE_TIMEOUT_S = 0.2

    async def scenario() -> tuple[bool, int]:
        try:
            reader, writer = await _connect()
            writer.write(peer_wire.hello_frame(peer_wire.new_nonce()))  # and never a proof
            dropped = await _closed(reader)
            writer.close()
            return dropped, peer_listener.pending()
        finally:
            peer_listener.stop()

    before = _refused("handshake_timeout")
    assert asyncio.run(scenario()) == (True, 0)
    assert _refused("handshake_timeout") == before + 1


def test_the_default_handshake_deadline_is_short():
    from django.conf import settings

    assert settings.TUNNEL_PEER_HANDSHAKE_TIMEOUT_S <= 5
    assert 0 < settings.TUNNEL_PEER_MAX_PENDING <= 256


def test_connections_beyond_the_pending_cap_are_closed_at_once_and_proven_links_do_not_count(settings):
    settings.TUNNEL_PEER_HANDSHAKE_TIMEOUT_S = 600
    settings.TUNNEL_PEER_MAX_PENDING = 3

    async def scenario() -> None:
        try:
            waiting = [await _connect() for _ in range(3)]
            await _until_pending(3)
            reader, writer = await _connect()
            assert await _closed(reader)  # the fourth: closed without waiting for any deadline
            writer.close()
            assert peer_listener.pending() == 3
            assert not any(r.at_eof() for r, _ in waiting)
            # one of them proves the key: it leaves the pending ones, and a new connection is admitted again
            await _prove_the_key(*waiting[0])
            await _until_pending(2)
            again = await _connect()
            await _until_pending(3)
            assert not waiting[0][0].at_eof()
            for _, w in [*waiting, again]:
                w.close()
            await _until_pending(0)  # gone connections leave the count
        finally:
            peer_listener.stop()

    before = _refused("pending_cap")
    asyncio.run(scenario())
    assert _refused("pending_cap") == before + 1

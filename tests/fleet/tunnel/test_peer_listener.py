"""This process's peer listener: which port it takes, which address it advertises, one per event loop."""

from __future__ import annotations

import asyncio
import socket

import pytest

from fleet.tunnel import peer_listener, peer_wire
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

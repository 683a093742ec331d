"""Admission of tunnel handshakes: at most AGENT_MAX_HANDSHAKES per process between connect and welcome.

Beyond the limit a new tunnel is answered at once with a Backoff frame (the agent waits `retry_after_s`)
and closed with CLOSE_BACKOFF, before anything is signed or read from the database; a place frees when
the handshake ends (welcome sent, socket closed). Driven through the real ASGI application over the
real Redis channel layer and PostgreSQL, as in `test_tunnel_bad_input`.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlencode

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from agent import protocol as p
from cleverthis.asgi import application
from fleet import services
from fleet.models import Node
from fleet.tunnel.consumer import CLOSE_BACKOFF, AgentTunnelConsumer
from fleet.tunnel.handshakes import HANDSHAKES
from tests.fleet.tunnel.test_tunnel_bad_input import _close_of, _frame, _hello, _open, _register

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cluster(owner, workspace):  # type: ignore[no-untyped-def]
    return services.cluster_create(actor=owner, workspace=workspace, name="handshake-gate")


async def _until_free(timeout: float = 10) -> None:
    """Wait until no handshake holds a place (the hello's last steps run after the welcome is sent)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while HANDSHAKES.open and loop.time() < deadline:
        await asyncio.sleep(0.01)
    assert HANDSHAKES.open == 0


async def _refused(settings) -> p.Backoff:  # type: ignore[no-untyped-def]
    """Open a tunnel that the gate must refuse: its Backoff frame (the close is checked too)."""
    comm = WebsocketCommunicator(application, f"/agent/tunnel?{urlencode({'agent_nonce': 'n0nce-0f-the-agent'})}")
    connected, _ = await comm.connect()
    assert connected
    frame = await _frame(comm)
    assert isinstance(frame, p.Backoff), frame
    closed = await _close_of(comm)
    assert closed["code"] == CLOSE_BACKOFF
    await comm.disconnect()
    return frame


@pytest.mark.asyncio
async def test_over_the_limit_a_tunnel_is_told_to_back_off_and_closed(settings, monkeypatch):
    settings.AGENT_MAX_HANDSHAKES = 2
    settings.NODE_OFFLINE_GRACE_S = 10
    consumers = []
    original_connect = AgentTunnelConsumer.connect

    async def counted_connect(self):  # type: ignore[no-untyped-def]
        consumers.append(self)
        await original_connect(self)

    monkeypatch.setattr(AgentTunnelConsumer, "connect", counted_connect)
    first, _ = await _open()
    second, _ = await _open()
    backoffs = [await _refused(settings) for _ in range(5)]
    assert len(consumers) == 2  # the refused sockets never got a consumer (nor a channel-layer subscription)
    assert all(2.2 <= b.retry_after_s <= 6.7 for b in backoffs), [b.retry_after_s for b in backoffs]
    assert "busy" in backoffs[0].reason
    assert HANDSHAKES.open == 2  # the refused ones never held a place
    await first.disconnect()
    await second.disconnect()
    assert HANDSHAKES.open == 0


@pytest.mark.asyncio
async def test_a_place_frees_when_the_welcome_is_sent(settings, cluster, owner):
    settings.AGENT_MAX_HANDSHAKES = 1
    ident = await sync_to_async(_register)(cluster, owner)
    comm, challenge = await _open()
    await _refused(settings)
    await comm.send_to(text_data=p.encode(_hello(ident, challenge)))
    assert isinstance(await _frame(comm), p.Welcome)
    await _until_free()  # the rest of the hello (commands pending for the node) runs after the welcome
    # the authenticated tunnel no longer counts: the next agent gets its challenge
    other, _ = await _open()
    assert HANDSHAKES.open == 1
    assert await sync_to_async(lambda: Node.objects.get(pk=ident.node_id).connected)()
    await other.disconnect()
    await comm.disconnect()
    assert HANDSHAKES.open == 0


@pytest.mark.asyncio
async def test_a_place_frees_when_the_socket_closes_before_its_hello(settings):
    settings.AGENT_MAX_HANDSHAKES = 1
    comm, _ = await _open()
    await _refused(settings)
    await comm.disconnect()
    again, _ = await _open()
    await again.disconnect()
    assert HANDSHAKES.open == 0


@pytest.mark.asyncio
async def test_a_refused_hello_frees_its_place(settings, cluster, owner):
    settings.AGENT_MAX_HANDSHAKES = 1
    ident = await sync_to_async(_register)(cluster, owner)
    comm, challenge = await _open()
    await comm.send_to(text_data=p.encode(_hello(ident, challenge, signature_b64="AAAA")))
    closed = await _close_of(comm)
    assert closed["code"] == p.CLOSE_UNAUTHORIZED
    await comm.disconnect()
    again, _ = await _open()
    await again.disconnect()
    assert HANDSHAKES.open == 0

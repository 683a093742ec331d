"""No frame before Welcome: a command handed to a tunnel while it says hello waits for the Welcome.

A fan-out reaches the tunnels of a process through its inbox, which hands each command to the tunnel
registered here (`fleet.tunnel.local_tunnels`) directly, beside the consumer's own message loop. A tunnel
registered before its Welcome went out let such a command overtake it, and the agent dropped the new
tunnel ("expected welcome, got command"). Driven through the real ASGI application over the real Redis
channel layer and PostgreSQL.
"""

from __future__ import annotations

import asyncio

import pytest
from channels.layers import get_channel_layer

from agent import protocol as p
from fleet.groups import command_message
from fleet.tunnel import local_tunnels
from tests.fleet.tunnel.test_tunnel_bad_input import _frame, _hello, _open, node_identity  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


async def _hand_over_as_soon_as_registered(node_id: str) -> None:
    """What the process inbox does with a fan-out's command: to the tunnel here, the moment there is one."""
    frame = p.Command(command_id="c-1", idempotency_key="k-1", command_type="agent.update", payload={})
    while local_tunnels.get(node_id) is None:
        await asyncio.sleep(0)
    await local_tunnels.deliver_commands(get_channel_layer(), [[node_id, command_message("c-1", frame)]])


@pytest.mark.asyncio
async def test_a_command_handed_over_during_the_hello_follows_the_welcome(node_identity):  # noqa: F811
    comm, challenge = await _open()
    courier = asyncio.ensure_future(_hand_over_as_soon_as_registered(node_identity.node_id))
    try:
        await comm.send_to(text_data=p.encode(_hello(node_identity, challenge)))
        first = await _frame(comm)
        assert isinstance(first, p.Welcome), first
        await asyncio.wait_for(courier, 5)
        second = await _frame(comm)
        assert isinstance(second, p.Command)
        assert second.command_id == "c-1"
    finally:
        courier.cancel()
        await comm.disconnect()

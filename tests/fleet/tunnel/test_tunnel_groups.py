"""A tunnel renews its channel-layer group memberships on heartbeats: commands reach it after Redis forgot them.

Redis drops a group membership after channels_redis's group_expiry (a day) or loses it with its keys; a
command sent to the node's group then reached no socket, while the node still looked connected. Driven
through the real ASGI application over the real Redis channel layer and PostgreSQL.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from channels.layers import get_channel_layer
from django.conf import settings

from agent import protocol as p
from fleet.groups import AGENTS_GROUP, command_message, node_group
from tests.fleet.tunnel.test_tunnel_bad_input import _authenticated, _frame, node_identity  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


async def _forget_groups(node_id: str) -> None:
    """What Redis does when a membership expires or its keys are lost."""
    layer = get_channel_layer()
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    try:
        await client.delete(layer._group_key(node_group(node_id)), layer._group_key(AGENTS_GROUP))
    finally:
        await client.aclose()


async def _send_command(node_id: str) -> None:
    frame = p.Command(command_id="c-1", idempotency_key="k-1", command_type="agent.update", payload={})
    await get_channel_layer().group_send(node_group(node_id), command_message("c-1", frame))


async def _command_arrives(comm) -> bool:
    while True:
        got = await _frame(comm, 5)
        if isinstance(got, p.Command):
            return got.command_id == "c-1"


async def _heartbeat(comm) -> None:
    await comm.send_to(text_data=p.encode(p.Heartbeat(cpu_percent=1.0, memory_percent=2.0)))
    while not isinstance(await _frame(comm), p.HeartbeatAck):
        pass


@pytest.mark.asyncio
async def test_a_heartbeat_renews_the_group_redis_forgot(node_identity, settings):  # noqa: F811
    settings.TUNNEL_GROUP_REFRESH_S = 0.0
    comm = await _authenticated(node_identity)
    try:
        await _send_command(node_identity.node_id)
        assert await _command_arrives(comm)
        await _forget_groups(node_identity.node_id)
        await _send_command(node_identity.node_id)
        assert await comm.receive_nothing(1.0)  # lost: the group has no member
        await _heartbeat(comm)
        await asyncio.sleep(0.2)  # the renewal follows the ack
        await _send_command(node_identity.node_id)
        assert await _command_arrives(comm)
    finally:
        await comm.disconnect()


@pytest.mark.asyncio
async def test_heartbeats_renew_at_most_every_refresh_interval(node_identity, settings):  # noqa: F811
    settings.TUNNEL_GROUP_REFRESH_S = 3600.0
    comm = await _authenticated(node_identity)
    try:
        await _forget_groups(node_identity.node_id)
        await _heartbeat(comm)
        await asyncio.sleep(0.2)
        await _send_command(node_identity.node_id)
        assert await comm.receive_nothing(1.0)  # not renewed: not due yet
    finally:
        await comm.disconnect()

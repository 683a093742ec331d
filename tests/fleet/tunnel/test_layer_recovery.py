"""The channel layer failing does not touch tunnels, and a tunnel that must end frees what it held.

- Redis losing its data (a restart without persistence, a flush) loses every group membership: the
  tunnels of a process join their groups again as soon as it is noticed (`local_tunnels.GroupRecovery`),
  without waiting for a heartbeat's renewal, and commands reach them again over the same socket.
- Recording a frame failing in the database (here: the tunnel's database session is ended while it waits
  for a row lock, as a failover does) closes the tunnel with 1011 instead of killing the consumer: it is
  no longer registered in its process, its node reads disconnected and its streams end with "tunnel
  closed" at once, so requests never land on (or wait for) a dead tunnel, and the agent's reconnect gets
  every unfinished command again.

Driven through the real ASGI application over the real Redis channel layer (this test's own Redis
database) and PostgreSQL.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import connection, connections

from agent import protocol as p
from fleet import services
from fleet.groups import command_message, node_group
from fleet.models import Node
from fleet.proxy.streams import TunnelStream
from fleet.tunnel import local_tunnels
from tests.fleet.tunnel.test_tunnel_bad_input import _authenticated, _close_of, _frame, node_identity  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


async def _command_arrives(comm, node_id: str, command_id: str, *, tries: int = 30) -> bool:
    """Send the command to the node's group until it reaches the socket (each try waits 0.5 s)."""
    frame = p.Command(command_id=command_id, idempotency_key=command_id, command_type="agent.update", payload={})
    for _ in range(tries):
        await get_channel_layer().group_send(node_group(node_id), command_message(command_id, frame))
        while not await comm.receive_nothing(0.5):  # (a timed-out receive_output would cancel the app)
            got = await _frame(comm)
            if isinstance(got, p.Command) and got.command_id == command_id:
                return True
    return False


@pytest.mark.asyncio
async def test_commands_reach_the_same_tunnel_after_redis_lost_its_data(node_identity, settings):  # noqa: F811
    settings.TUNNEL_GROUP_REFRESH_S = 3600.0  # no heartbeat renews the groups here
    comm = await _authenticated(node_identity)
    try:
        assert await _command_arrives(comm, node_identity.node_id, "before", tries=1)
        rounds = local_tunnels.GROUP_RECOVERY.rounds
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        try:
            await client.flushdb()  # what a restart without persistence leaves: nothing
        finally:
            await client.aclose()
        assert await _command_arrives(comm, node_identity.node_id, "after")
        assert local_tunnels.GROUP_RECOVERY.rounds > rounds
        assert local_tunnels.get(node_identity.node_id) is not None
        assert await sync_to_async(lambda: Node.objects.get(pk=node_identity.node_id).connected)()
    finally:
        await comm.disconnect()


def _hold_row_lock(command_id: object) -> object:
    """Another session holds the command's row (the ack's record will wait for it)."""
    locker = connections.create_connection("default")
    locker.set_autocommit(False)
    with locker.cursor() as cursor:
        cursor.execute("SELECT id FROM fleet_command WHERE id = %s FOR UPDATE", [command_id])
    return locker


def _release(locker) -> None:  # type: ignore[no-untyped-def]
    locker.rollback()
    locker.close()


def _terminate_waiting_session() -> bool:
    """End the database session that waits for the command's row lock (a failover's doing); True once done."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return bool(cursor.fetchall())


@pytest.mark.asyncio
async def test_a_failed_ack_record_closes_the_tunnel_and_frees_it(node_identity, owner, cluster):  # noqa: F811
    """(Before: the error escaped the consumer, which died without its disconnect: still registered.)"""
    comm = await _authenticated(node_identity)
    node = await sync_to_async(Node.objects.get)(pk=node_identity.node_id)
    (command,) = await sync_to_async(services.command_queue)(
        actor=owner, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}, node=node
    )
    stream = await TunnelStream.open(node_id=node_identity.node_id, port=8000)  # a request in flight
    locker = await sync_to_async(_hold_row_lock)(command.pk)
    try:
        await comm.send_to(text_data=p.encode(p.Ack(command_id=str(command.pk))))
        for _ in range(100):
            if await sync_to_async(_terminate_waiting_session)():
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the ack's record never waited for the row lock")
        closed = await _close_of(comm, 10)
        assert closed["code"] == 1011
        assert local_tunnels.get(node_identity.node_id) is None
        assert not await sync_to_async(lambda: Node.objects.get(pk=node.pk).connected)()
        assert await stream.read(timeout=5) == b""  # the stream ended at once, with the reason
        assert stream.error == "tunnel closed"
    finally:
        await stream.close()
        await sync_to_async(_release)(locker)
        await comm.disconnect()


@pytest.mark.asyncio
async def test_a_consumer_that_fails_on_a_channel_message_runs_its_disconnect(node_identity):  # noqa: F811
    """A channel-layer message the consumer cannot handle (here a command id that is no UUID) ends the
    tunnel, not silently: unregistered, node disconnected, streams ended, closed with 1011. (Before: the
    error escaped Channels' dispatch and the consumer died without its disconnect.)"""
    comm = await _authenticated(node_identity)
    stream = await TunnelStream.open(node_id=node_identity.node_id, port=8000)
    try:
        await get_channel_layer().group_send(
            node_group(node_identity.node_id), {"type": "node.command", "command_id": "not-a-uuid"}
        )
        closed = await _close_of(comm, 10)
        assert closed["code"] == 1011
        assert local_tunnels.get(node_identity.node_id) is None
        assert not await sync_to_async(lambda: Node.objects.get(pk=node_identity.node_id).connected)()
        assert await stream.read(timeout=5) == b""
        assert stream.error == "tunnel closed"
    finally:
        await stream.close()
        await comm.disconnect()

"""The tunnel's database work: reports and heartbeats of all the tunnels of a process written together,
a node's connect, inventory and pending commands; all on the thread pool (`database_sync_to_async`)."""

from __future__ import annotations

import uuid
from typing import Any
from uuid import UUID

from channels.db import DatabaseSyncToAsync

from agent import protocol as p
from fleet import services
from fleet.models import Command, Node
from fleet.tunnel.batching import Coalescer


def database_sync_to_async(func: Any) -> Any:
    """Run ORM work for tunnels on the thread pool, not daphne's one shared sync thread.

    Each tunnel's calls still run one at a time (the consumer awaits them in order), but hundreds of
    tunnels no longer queue behind one another; Django gives each pool thread its own connection.
    """
    return DatabaseSyncToAsync(func, thread_sensitive=False)


async def _write_reports(reports: list[services.CommandReport]) -> list[Any]:
    return await database_sync_to_async(services.command_record_reports)(reports=reports)


# Acks, results and errors from all tunnels of this process, written together when they arrive
# together (a fan-out to All nodes); each tunnel still awaits its own, so its frames stay in order.
REPORTS: Coalescer[services.CommandReport, Command | None] = Coalescer(_write_reports)


async def _write_heartbeats(beats: list[tuple[UUID, p.Heartbeat]]) -> list[Any]:
    disconnected = await database_sync_to_async(services.node_record_heartbeats)(beats=beats)
    return [UUID(str(node_id)) in disconnected for node_id, _ in beats]


# Heartbeats of all tunnels of this process: those that arrive together are one UPDATE together. Each
# submitter learns whether the database holds its node as disconnected (then its tunnel must close).
HEARTBEATS: Coalescer[tuple[UUID, p.Heartbeat], bool] = Coalescer(_write_heartbeats)


def connect_node(
    node_id: UUID, hello: p.Hello, inbox: str, peer: str, session: uuid.UUID, protocol: int
) -> Node | None:
    node = Node.objects.select_related("cluster").filter(pk=node_id).first()
    if node is None:
        return None
    services.node_connected(
        node=node,
        facts=hello.facts,
        inventory=hello.inventory,
        inbox=inbox,
        peer=peer,
        session=session,
        protocol_version=protocol,
    )
    return Node.objects.select_related("cluster").get(pk=node_id)


def record_inventory(node_id: UUID, inventory: p.Inventory) -> None:
    node = Node.objects.filter(pk=node_id).first()
    if node is not None:
        services.node_record_inventory(node=node, inventory=inventory)


def load_command(node_id: UUID, command_id: str) -> Command | None:
    return Command.objects.filter(id=command_id, node_id=node_id).first()

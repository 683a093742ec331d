"""The tunnels this process holds, and this process's inbox for messages meant for many of them.

Each authenticated tunnel consumer registers here by node id. Two things use the registry:

- a stream opened in this process (`fleet.tunnel.streams_seam.LocalStream`; the proxy's `TunnelStream`)
  talks to a tunnel held by the same process in memory, not via Redis;
- a fan-out to All nodes sends **one** channel-layer message per process (to its inbox, whose name is
  stored on each node row as `Node.tunnel_inbox`) instead of one per node; the inbox hands each
  command to its tunnel here. A node whose tunnel left this process meanwhile gets its message through
  its node group, wherever the tunnel now is (and a reconnecting agent gets every unfinished command
  on hello anyway).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from channels.layers import get_channel_layer

from fleet.groups import INBOX_COMMANDS, NODE_COMMAND, node_group
from fleet.tunnel.streams_seam import LocalStream

log = logging.getLogger("fleet.tunnel")


class LocalTunnel(Protocol):
    """What a tunnel consumer held by this process offers to the rest of the process."""

    async def node_command(self, message: dict[str, Any]) -> None: ...

    async def open_local_stream(self, stream: LocalStream, opening: dict[str, Any]) -> None: ...

    async def stream_message(self, message: dict[str, Any]) -> None: ...


_tunnels: dict[str, LocalTunnel] = {}
_inbox: dict[str, Any] = {"loop": None, "name": "", "task": None}


def get(node_id: Any) -> LocalTunnel | None:
    """The tunnel of `node_id` if this process holds it."""
    return _tunnels.get(str(node_id))


def add(node_id: Any, tunnel: LocalTunnel) -> None:
    """Register an authenticated tunnel (the newest one wins if an old socket has not closed yet)."""
    _tunnels[str(node_id)] = tunnel


def discard(node_id: Any, tunnel: LocalTunnel) -> None:
    """Forget `tunnel` if it still is the registered one for `node_id`."""
    if _tunnels.get(str(node_id)) is tunnel:
        del _tunnels[str(node_id)]


async def inbox() -> str:
    """This process's inbox channel (created, and its reader started, on first use in this event loop)."""
    loop = asyncio.get_running_loop()
    if _inbox["loop"] is not loop or _inbox["task"] is None or _inbox["task"].done():
        layer = get_channel_layer()
        # the default "specific" prefix: channels_redis reads all of a process's own channels through
        # one shared loop that pops only that prefix, so a custom prefix would never be read
        name = await layer.new_channel()
        _inbox.update(loop=loop, name=name, task=loop.create_task(_read_inbox(layer, name)))
    return _inbox["name"]


async def _read_inbox(layer: Any, name: str) -> None:
    task = asyncio.current_task()
    while True:
        # A library that lost our cancellation (returned instead of raising) must not keep us reading:
        # the task is still marked as being cancelled, and it ends here.
        if task is not None and task.cancelling():
            raise asyncio.CancelledError
        try:
            message = await layer.receive(name)
        except Exception:  # (a CancelledError is no Exception and ends the loop as usual)
            if task is not None and task.cancelling():  # shutting down (the cancel surfaced as an error)
                raise asyncio.CancelledError from None
            # Redis away: keep trying, the tunnels' own groups still work
            log.exception("tunnel inbox %s: receive failed; retrying", name)
            await asyncio.sleep(1.0)
            continue
        if message.get("type") == INBOX_COMMANDS:
            await deliver_commands(layer, message["commands"])


async def deliver_commands(layer: Any, commands: list[list[Any]]) -> None:
    """Hand each command to its tunnel here; one that is not here goes through its node group."""
    for node_id, message in commands:
        if message.get("type") != NODE_COMMAND:
            continue
        tunnel = _tunnels.get(str(node_id))
        try:
            if tunnel is not None:
                await tunnel.node_command(message)
            else:
                await layer.group_send(node_group(node_id), message)
        except Exception:  # one broken socket must not stop the others' commands
            log.exception("delivering command %s to node %s failed", message.get("command_id"), node_id)

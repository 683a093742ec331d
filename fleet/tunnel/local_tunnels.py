"""The tunnels this process holds, and this process's inbox for messages meant for many of them.

Each authenticated tunnel consumer registers here by node id. Two things use the registry:

- a stream opened in this process (`fleet.tunnel.streams_seam.LocalStream`; the proxy's `TunnelStream`)
  talks to a tunnel held by the same process in memory, not via Redis;
- a fan-out to All nodes sends **one** channel-layer message per process (to its inbox, whose name is
  stored on each node row as `Node.tunnel_inbox`) instead of one per node; the inbox hands each
  command to its tunnel here. A node whose tunnel left this process meanwhile gets its message through
  its node group, wherever the tunnel now is (and a reconnecting agent gets every unfinished command
  on hello anyway).

When the channel layer fails in this process (Redis restarting: its group memberships are gone with it),
`layer_failed` joins every tunnel here to its groups again as soon as Redis answers (`GroupRecovery`):
the tunnels stay open underneath, and commands and fan-outs reach them again. A restart no receive
noticed (the Redis client reconnects by itself) is found by `_watch_layer`: a key of this process's own
that Redis no longer holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import Any, Protocol

import redis.asyncio as aioredis
from channels.layers import get_channel_layer
from django.conf import settings

from fleet.groups import INBOX_COMMANDS, NODE_COMMAND, node_group
from fleet.tunnel.streams_seam import LocalStream

log = logging.getLogger("fleet.tunnel")


class LocalTunnel(Protocol):
    """What a tunnel consumer held by this process offers to the rest of the process."""

    async def node_command(self, message: dict[str, Any]) -> None: ...

    async def open_local_stream(self, stream: LocalStream, opening: dict[str, Any]) -> None: ...

    async def stream_message(self, message: dict[str, Any]) -> None: ...

    async def join_groups(self) -> None: ...

    async def send_pending_commands(self) -> None: ...


_tunnels: dict[str, LocalTunnel] = {}
_inbox: dict[str, Any] = {"loop": None, "name": "", "task": None, "watch": None}


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


# Back-off between attempts to reach the channel layer again after it failed (doubling, with jitter).
LAYER_RETRY_FIRST_S = 0.2
LAYER_RETRY_MAX_S = 5.0


def layer_retry_delay(attempt: int) -> float:
    """The wait before attempt `attempt` (0 first) to use a failed channel layer again: doubling from
    LAYER_RETRY_FIRST_S up to LAYER_RETRY_MAX_S, each between half and all of it (the tunnels of a process
    do not all knock at once)."""
    ceiling = min(LAYER_RETRY_MAX_S, LAYER_RETRY_FIRST_S * 2**attempt)
    return ceiling * (0.5 + random.random() / 2)


class GroupRecovery:
    """Joins every tunnel of this process to its groups again after the channel layer failed here.

    Redis restarting loses every group membership (it keeps none on disk); the tunnel whose receive
    noticed it, and any other, are told through `failed()`. One task per event loop then tries, with
    back-off, until every tunnel registered here got back into its groups; a failure noticed while it
    runs makes it go round once more. `rounds` counts the completed rounds (for tests and logs).
    """

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._again = False
        self.rounds = 0

    def failed(self) -> None:
        """The channel layer failed: (re)join every tunnel here once it answers again."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._loop is not loop:
            self._loop = loop
            self._task = loop.create_task(self._rejoin_all())
        else:
            self._again = True

    async def _rejoin_all(self) -> None:
        attempt = 0
        while True:
            await asyncio.sleep(layer_retry_delay(attempt))
            self._again = False
            try:
                for tunnel in list(_tunnels.values()):
                    await tunnel.join_groups()
            except Exception as exc:  # Redis still away: the next round
                attempt += 1
                log.warning("channel layer still failing (%s); joining the tunnels' groups again later", exc)
                continue
            if self._again:
                attempt = 0
                continue
            self.rounds += 1
            log.info("channel layer back: %d tunnels of this process joined their groups again", len(_tunnels))
            for tunnel in list(_tunnels.values()):  # what was sent to their groups meanwhile reached no one
                try:
                    await tunnel.send_pending_commands()
                except Exception as exc:  # the tunnel closed meanwhile, or the database is away: its hello resends
                    log.warning("sending a tunnel's pending commands after the channel layer came back failed: %s", exc)
            return


GROUP_RECOVERY = GroupRecovery()


def layer_failed() -> None:
    """A receive or send on the channel layer failed in this process (Redis restarting)."""
    GROUP_RECOVERY.failed()


async def receive_through_failures(layer: Any, channel: str, node_id: Any) -> dict[str, Any]:
    """The next message on `channel` (a tunnel's own). The layer failing (Redis restarting) ends nothing:
    the receive is tried again with back-off while the tunnel stays open, and every tunnel of this
    process joins its groups again once Redis answers (`layer_failed`)."""
    attempt = 0
    while True:
        try:
            return await layer.receive(channel)
        except Exception as exc:  # (a cancel is no Exception: the consumer ending)
            delay = layer_retry_delay(attempt)
            log.warning(
                "tunnel of node %s: channel-layer receive failed (%s: %s); retrying in %.1fs",
                node_id,
                type(exc).__name__,
                exc,
                delay,
            )
            layer_failed()
            attempt += 1
            await asyncio.sleep(delay)


async def inbox() -> str:
    """This process's inbox channel (created, and its reader started, on first use in this event loop)."""
    loop = asyncio.get_running_loop()
    if _inbox["loop"] is not loop or _inbox["task"] is None or _inbox["task"].done():
        layer = get_channel_layer()
        # the default "specific" prefix: channels_redis reads all of a process's own channels through
        # one shared loop that pops only that prefix, so a custom prefix would never be read
        name = await layer.new_channel()
        _inbox.update(
            loop=loop,
            name=name,
            task=loop.create_task(_read_inbox(layer, name)),
            watch=loop.create_task(_watch_layer(name)),
        )
    return _inbox["name"]


# How often each web process looks whether Redis still holds its key (`_watch_layer`), and that key's life.
LAYER_CHECK_S = 2.0
LAYER_KEY_TTL_S = 600


async def _watch_layer(name: str) -> None:
    """Every LAYER_CHECK_S, set this process's key in Redis and read what it held: a key set before and
    now gone means Redis lost its data (a restart without persistence, a flush), and with it every group
    membership, even when no receive here failed. The tunnels here then join their groups again."""
    client = aioredis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=5)
    key = f"cleverthis:tunnels:process:{name}"
    was_set = failing = False
    try:
        while True:
            try:
                held = await client.set(key, "1", ex=LAYER_KEY_TTL_S, get=True)
            except Exception as exc:
                if not failing:
                    log.warning("Redis does not answer this process's check (%s); still trying", exc)
                failing = True
            else:
                failing = False
                if held is None and was_set:
                    log.warning("Redis lost its data (restarted or flushed): tunnels here join their groups again")
                    layer_failed()
                was_set = True
            await asyncio.sleep(LAYER_CHECK_S)
    finally:
        with contextlib.suppress(Exception):  # the loop is going away
            await client.aclose()


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
            # Redis away: keep trying; its restart lost the tunnels' groups, which are joined again
            log.warning("tunnel inbox %s: receive failed; retrying", name, exc_info=True)
            layer_failed()
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

"""Channel-layer group names and message shapes shared by services, tasks and the tunnel consumer.

Every message for a node goes to the group `node_group(node_id)`; the consumer holding that node's
socket is a member and handles `type` "node.command" (method `node_command`), "node.revoke"
(method `node_revoke`) and "node.silent" (method `node_silent`).
"""

from __future__ import annotations

import uuid
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from agent import protocol

# Every authenticated tunnel also joins this group, for broadcasts such as "back off during a deploy".
AGENTS_GROUP = "agents.all"
AGENTS_BACKOFF = "agents.backoff"
NODE_COMMAND = "node.command"
NODE_REVOKE = "node.revoke"
NODE_SILENT = "node.silent"
# A node's new tunnel was welcomed: older tunnels of the node leave its groups and close once their
# streams ended (a move, `fleet.tunnel.drain`, or a reconnect while the old socket lingers).
NODE_SUPERSEDED = "node.superseded"
# A process inbox message (`fleet.tunnel.local_tunnels`) carrying many nodes' `node.command` messages.
INBOX_COMMANDS = "tunnels.commands"


def _layer() -> Any:
    layer = get_channel_layer()
    if layer is None:  # pragma: no cover - CHANNEL_LAYERS is always configured
        raise RuntimeError("no channel layer configured")
    return layer


def node_group(node_id: uuid.UUID | str) -> str:
    """The channel-layer group of one node's tunnel."""
    return f"node.{node_id}"


def command_message(command_id: uuid.UUID | str, frame: protocol.Command | None = None) -> dict[str, Any]:
    """Deliver command `command_id`: the consumer sends `frame` as it is, or loads the row when None.

    Pass the frame only for commands without secrets: what goes through Redis is not encrypted, and
    secrets stay in the database until the consumer itself reads them.
    """
    message: dict[str, Any] = {"type": NODE_COMMAND, "command_id": str(command_id)}
    if frame is not None:
        message["frame"] = protocol.encode(frame)
    return message


def revoke_message(reason: str = "node deleted") -> dict[str, Any]:
    """Tell the consumer to send `Revoked` and close the socket."""
    return {"type": NODE_REVOKE, "reason": reason}


def silent_message(silent_s: float) -> dict[str, Any]:
    """The node was marked lost (no heartbeat for `silent_s`): close a tunnel of it that is still held.

    The consumer spares a socket that carried a hello or heartbeat within the last `silent_s / 2`
    seconds: that one is a newer, live tunnel of the same node.
    """
    return {"type": NODE_SILENT, "silent_s": float(silent_s)}


def send_to_node(node_id: uuid.UUID | str, message: dict[str, Any]) -> None:
    """Send `message` to the node's group from synchronous code."""
    layer = _layer()
    async_to_sync(layer.group_send)(node_group(node_id), message)


def send_to_nodes(messages: list[tuple[uuid.UUID | str, dict[str, Any]]], *, concurrency: int = 64) -> list[bool]:
    """Send many (node_id, message) pairs from synchronous code in one event loop; True per success."""
    import asyncio

    layer = _layer()

    async def send_all() -> list[bool]:
        gate = asyncio.Semaphore(concurrency)

        async def one(node_id: uuid.UUID | str, message: dict[str, Any]) -> bool:
            async with gate:
                try:
                    await layer.group_send(node_group(node_id), message)
                except Exception:  # reported per message; the caller un-claims those
                    return False
                return True

        return list(await asyncio.gather(*(one(n, m) for n, m in messages)))

    return async_to_sync(send_all)()


def ask_all_agents_to_back_off(retry_after_s: float, reason: str) -> None:
    """Ask every connected agent, on every replica, to disconnect and return after `retry_after_s`."""
    async_to_sync(_layer().group_send)(
        AGENTS_GROUP, {"type": AGENTS_BACKOFF, "retry_after_s": retry_after_s, "reason": reason}
    )


def send_to_inbox(inbox: str, messages: list[tuple[uuid.UUID | str, dict[str, Any]]]) -> bool:
    """Send many nodes' `node.command` messages as one message to a process inbox; True on success."""
    layer = _layer()
    try:
        async_to_sync(layer.send)(inbox, inbox_commands_message(messages))
    except Exception:  # the caller un-claims these commands
        return False
    return True


def inbox_commands_message(items: list[tuple[Any, dict[str, Any]]]) -> dict[str, Any]:
    """One inbox message carrying `node.command` messages for many nodes: [(node_id, message), …]."""
    return {"type": INBOX_COMMANDS, "commands": [[str(node_id), message] for node_id, message in items]}


def command_frame(command: Any) -> protocol.Command:
    """The `Command` frame for a `fleet.models.Command` row (secrets merged back into the payload)."""
    return protocol.Command(
        command_id=str(command.pk),
        idempotency_key=command.idempotency_key,
        command_type=command.command_type,
        payload=command.wire_payload(),
    )

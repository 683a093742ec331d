"""Drive the control plane the way the tunnel consumer does when agent frames arrive.

Each helper calls the same fleet services the consumer calls for a frame (`command_record_ack`,
`command_record_result`, `command_record_error`, `node_record_inventory`); the workload receivers
(`fleet.workloads.receivers`) follow through the fleet's signals, exactly once per frame.
"""

from __future__ import annotations

from typing import Any

from agent import protocol
from fleet import services
from fleet.models import Command, Node


def ack(command: Command) -> Command:
    """An `Ack` frame."""
    node = Node.objects.get(pk=command.node_id)
    done = services.command_record_ack(node=node, command_id=command.pk) or Command.objects.get(pk=command.pk)
    return done


def result(command: Command, **data: Any) -> Command:
    """`Ack` then `Result` frames."""
    ack(command)
    node = Node.objects.get(pk=command.node_id)
    done = services.command_record_result(node=node, command_id=command.pk, data=data)
    assert done is not None
    return done


def error(command: Command, code: str, message: str) -> Command:
    """`Ack` then `Error` frames."""
    assert code in protocol.ERROR_CODES
    ack(command)
    node = Node.objects.get(pk=command.node_id)
    done = services.command_record_error(node=node, command_id=command.pk, code=code, message=message)
    assert done is not None
    return done


def inventory(node: Node, *, containers=(), models=(), endpoints=()) -> Node:
    """An `InventoryReport` frame (containers/models/endpoints as protocol dataclasses)."""
    inv = protocol.Inventory(containers=list(containers), models=list(models), endpoints=list(endpoints))
    node = services.node_record_inventory(node=node, inventory=inv)
    node.refresh_from_db()
    return node


def running(name: str, cid: str, image: str = "nginx:1.27", key: str = "", status: str = "running"):
    """A ContainerInfo as the agent reports it."""
    return protocol.ContainerInfo(container_id=cid, name=name, image=image, status=status, command_key=key)

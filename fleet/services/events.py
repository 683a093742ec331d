"""The node event log's one writer: every service (core and workloads) that records something about a
node in its log calls `node_event_record`."""

from __future__ import annotations

import uuid
from typing import Any

from fleet.models import Command, NodeEvent


def node_event_record(
    *,
    node_id: uuid.UUID | str,
    kind: str,
    message: str,
    data: dict[str, Any] | None = None,
    command: Command | None = None,
) -> NodeEvent:
    """Append one event to a node's log (about `command` if given); returns the row."""
    return NodeEvent.objects.create(node_id=node_id, kind=kind, message=message, data=data or {}, command=command)

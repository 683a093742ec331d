"""An endpoint's event log: one call records a line there and, when it concerns a node, on the node's log too."""

from __future__ import annotations

import uuid
from typing import Any

from fleet.models import Command
from fleet.services import node_event_record
from fleet.workloads.models import Endpoint, EndpointEvent


def endpoint_event_record(
    *,
    endpoint: Endpoint,
    kind: str,
    message: str,
    data: dict[str, Any] | None = None,
    node_id: uuid.UUID | str | None = None,
    command: Command | None = None,
) -> EndpointEvent:
    """Append one event to `endpoint`'s log (about `node_id` and `command` if given; the node's own log gets
    the same line, with the endpoint's id in its data); returns the endpoint's row."""
    data = {**(data or {}), "endpoint": str(endpoint.pk)}
    if node_id is not None:
        node_event_record(node_id=node_id, kind=kind, message=message, data=data, command=command)
    return EndpointEvent.objects.create(
        endpoint=endpoint, node_id=node_id, command=command, kind=kind, message=message, data=data
    )

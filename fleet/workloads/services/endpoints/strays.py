"""Servers a node runs that no live replica owns, ended: a start that succeeded after its replica was stopped
(the stop reached the agent first and answered `not_found`), and a server the agent reports but no live
replica of the node holds (one it reports `stray`: started by it, no longer in its records; or one of a
stopped or failed replica). Each gets one `endpoint.stop` of its id, with why on the endpoint's event log
(or the node's, for an id no replica has). Called inside the callers' transactions."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied

from agent import protocol
from fleet.models import Command, CommandStatus, CommandType, Node
from fleet.services import command_queue, node_event_record
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.services.common import system_actor
from fleet.workloads.services.endpoints.events import endpoint_event_record

# The inventory status of a server the agent started but does not own (`agent.workloads.endpoints.STRAY`).
STRAY = "stray"
# Replica states in which the node may run its server: a report of their id is no stray.
_OWNED = (EndpointStatus.PENDING, EndpointStatus.STARTING, EndpointStatus.RUNNING, EndpointStatus.STOPPING)


def server_stop_unowned(*, node: Node, server_id: str, why: str, endpoint: Endpoint | None = None) -> Command | None:
    """Tell `node` to end the server `server_id` that no live replica owns, once (None when a stop of it is
    still under way, or the workspace has no Owner/Admin to send it as); `why` goes to the event log."""
    pending = Command.objects.filter(
        node=node, command_type=CommandType.ENDPOINT_STOP, payload__endpoint_id=server_id
    ).exclude(status__in=CommandStatus.terminal())
    if pending.exists():
        return None
    try:
        actor = system_actor(node.cluster.workspace)
    except PermissionDenied:
        return None
    (command,) = command_queue(
        actor=actor,
        cluster=node.cluster,
        command_type=CommandType.ENDPOINT_STOP,
        payload=protocol.EndpointStopPayload(endpoint_id=server_id),
        node=node,
    )
    message = f"Server {server_id} on node {node.name} {why}: it was told to stop."
    if endpoint is not None:
        endpoint_event_record(
            endpoint=endpoint,
            node_id=node.pk,
            kind="endpoint.server_unowned",
            message=f"Endpoint {endpoint.hostname}: {message}",
            data={"replica": server_id},
            command=command,
        )
    else:
        node_event_record(
            node_id=node.pk,
            kind="endpoint.server_unowned",
            message=message,
            data={"server": server_id},
            command=command,
        )
    return command


def servers_end_unowned(*, node: Node, inventory: protocol.Inventory) -> int:
    """Stop each server the node reports that no live replica of it owns; returns how many stops were sent."""
    reported = {e.endpoint_id: e for e in inventory.endpoints if not e.container_id}
    if not reported:
        return 0
    owned = set(
        EndpointReplica.objects.filter(node=node, status__in=_OWNED, server_id__in=reported).values_list(
            "server_id", flat=True
        )
    )
    replicas = {
        r.server_id: r
        for r in EndpointReplica.objects.filter(server_id__in=set(reported) - owned).select_related("endpoint")
    }
    sent = 0
    for server_id, info in sorted(reported.items()):
        if server_id in owned or info.status in ("stopped", "failed"):
            continue
        replica = replicas.get(server_id)
        if info.status == STRAY:
            why = "runs outside its agent's records (a server the agent started and lost)"
        elif replica is not None:
            why = f"still runs although replica {server_id} is {replica.status}"
        else:
            why = "serves no endpoint of this control plane"
        if server_stop_unowned(
            node=node, server_id=server_id, why=why, endpoint=replica.endpoint if replica is not None else None
        ):
            sent += 1
    return sent

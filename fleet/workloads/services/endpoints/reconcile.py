"""The endpoints as a node reports them: its inventory after a (re)connect or heartbeat (running, gone,
unresponsive), and its deletion (its live replicas stopped, or failed as lost when it cannot be reached)."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from agent import protocol
from fleet.models import CommandType, Node
from fleet.services import command_queue
from fleet.workloads.errors import error_help, error_sentence
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.services.common import system_actor
from fleet.workloads.services.endpoints.events import endpoint_event_record
from fleet.workloads.services.endpoints.locking import lock_endpoints_on
from fleet.workloads.services.endpoints.replicas import endpoint_summarise
from fleet.workloads.services.endpoints.strays import servers_end_unowned
from fleet.workloads.services.endpoints.validation import valid_port

# The failure code of a replica whose server stopped answering the agent's health probes (also the
# status the agent reports for it: `agent.protocol.EndpointInfo`).
UNRESPONSIVE = "unresponsive"


def endpoints_end_with_node(*, node: Node, reachable: bool) -> int:
    """The live replicas of a node being deleted (inside its transaction); returns how many changed.

    With a tunnel open the agent is told to stop what it started before it exits (revocation): the replicas
    are stopped. Without one nothing can reach their servers: they fail as lost, and say so.
    """
    if reachable:
        status, code = EndpointStatus.STOPPED, "node_deleted"
        message = f"Node {node.name} was deleted: its agent was told to stop this endpoint's server."
    else:
        status, code = EndpointStatus.FAILED, "node_lost"
        message = (
            f"Node {node.name} was deleted while its agent was offline: this endpoint's server could not be "
            "reached and may still run on that machine."
        )
    endpoints = lock_endpoints_on(node, EndpointStatus.live())
    changed = EndpointReplica.objects.filter(node=node, status__in=EndpointStatus.live()).update(
        status=status, failure_code=code, failure_message=message, updated_at=timezone.now()
    )
    for endpoint in endpoints:
        endpoint_summarise(endpoint)
    return changed


def _fail_unresponsive(node: Node, endpoint: Endpoint, replica: EndpointReplica) -> None:
    """The agent's health probes of `replica`'s server failed: it fails (out of rotation; the healing pass
    replaces it, `heal.replica_lost`) and its hung server is told to stop, the replica staying failed.
    The caller saves the replica."""
    replica.status = EndpointStatus.FAILED
    replica.failure_code = UNRESPONSIVE
    if replica.group_rank is None:
        replica.failure_message = (
            f"The server on node {node.name} (port {replica.port or '?'}) stopped answering its health checks "
            "(GET /health): it was taken out of rotation and told to stop, and a replacement is started."
        )
    else:  # a group's leader, probed with a one-token completion; the group fails and heals as one
        replica.failure_message = (
            f"The group's leader on node {node.name} (port {replica.port or '?'}) stopped answering its health "
            "checks (a one-token completion): it was taken out of rotation and told to stop."
        )
    try:
        actor = system_actor(endpoint.cluster.workspace)
    except PermissionDenied:  # no Owner/Admin to send the stop as: the server stays until someone stops it
        actor = None
    command = None
    if actor is not None:
        (command,) = command_queue(
            actor=actor,
            cluster=endpoint.cluster,
            command_type=CommandType.ENDPOINT_STOP,
            payload=protocol.EndpointStopPayload(endpoint_id=replica.server_id),
            node=node,
        )
        replica.stop_command = command
    endpoint_event_record(
        endpoint=endpoint,
        node_id=node.pk,
        kind="endpoint.unresponsive",
        message=f"Endpoint {endpoint.hostname}, replica {replica.server_id}: "
        f"{error_sentence(UNRESPONSIVE, replica.failure_message)}",
        data={"replica": replica.server_id, "error_help": error_help(UNRESPONSIVE)},
        command=command,
    )


def endpoints_reconcile(*, node: Node, inventory: protocol.Inventory) -> int:
    """Running replicas the agent reports update their rows (port, status); running rows it no longer
    reports become failed (the process is gone), and so do those it reports `unresponsive` (the server
    hangs: failure code "unresponsive", its server told to stop). A server it reports that no live replica owns
    is told to stop (`strays.servers_end_unowned`). Returns how many replica rows changed."""
    reported = {e.endpoint_id: e for e in inventory.endpoints}
    changed = 0
    live = [EndpointStatus.STARTING, EndpointStatus.RUNNING, EndpointStatus.PENDING]
    with transaction.atomic():
        endpoints = {e.pk: e for e in lock_endpoints_on(node, live)}
        touched = set()
        for replica in EndpointReplica.objects.select_for_update().filter(node=node, status__in=live):
            info = reported.get(replica.server_id)
            if info is None:
                if replica.status != EndpointStatus.RUNNING:
                    continue  # start still in flight
                replica.status = EndpointStatus.FAILED
                replica.failure_code = "not_found"
                replica.failure_message = "The node no longer runs this endpoint (agent or node restarted?)."
                endpoint_event_record(
                    endpoint=endpoints[replica.endpoint_id],
                    node_id=node.pk,
                    kind="endpoint.failed",
                    message=f"Endpoint {endpoints[replica.endpoint_id].hostname}: replica {replica.server_id} is gone "
                    f"from node {node.name}",
                )
            elif info.status == "running" and valid_port(info.port):
                if replica.status == EndpointStatus.RUNNING and replica.port == info.port:
                    continue
                replica.status, replica.port = EndpointStatus.RUNNING, info.port
            elif info.status == UNRESPONSIVE:
                _fail_unresponsive(node, endpoints[replica.endpoint_id], replica)
            elif info.status in ("stopped", "failed"):
                replica.status = EndpointStatus(info.status)
            else:
                continue
            replica.save()
            touched.add(replica.endpoint_id)
            changed += 1
        for endpoint_id in touched:
            endpoint_summarise(endpoints[endpoint_id])
        servers_end_unowned(node=node, inventory=inventory)
    return changed

"""An endpoint's replicas: the start and stop commands of one replica, and the endpoint's summary of them.

Each replica is one server on one node that the agent knows by the replica's `server_id` (sent as the
`endpoint_id` of `endpoint.start` / `endpoint.stop`: the wire protocol is the one of single-node endpoints).
Called inside the callers' transactions.
"""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser
from django.db.models import Q
from django.utils import timezone

from agent import protocol
from fleet.models import Command, CommandType, Node
from fleet.services import command_queue
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus


def endpoint_adapter_refs(endpoint: Endpoint) -> list[protocol.LoraAdapterRef]:
    """The adapters attached to `endpoint`, as each replica's start carries them."""
    return [link.adapter.ref() for link in endpoint.adapter_links.select_related("adapter")]


# A distributed endpoint's `group_failure_code` once stopped by its workspace: it ends stopped, not healed.
GROUP_STOPPED = "group_stopped"

# The endpoint's status when its replicas are in several states: the first present wins.
_PRECEDENCE = (
    EndpointStatus.RUNNING,
    EndpointStatus.STARTING,
    EndpointStatus.PENDING,
    EndpointStatus.STOPPING,
    EndpointStatus.STOPPED,
)


def replica_queue_start(
    *,
    actor: AbstractBaseUser | None,
    endpoint: Endpoint,
    replica: EndpointReplica,
    node: Node,
    group: protocol.EndpointGroup | None = None,
) -> Command:
    """Queue `endpoint.start` of `replica` on `node` with the endpoint's current model, revision, server
    arguments and attached LoRA adapters (every start of a replica comes here: placement, restart, healing,
    the autoscaler, rolling updates, a distributed endpoint's ranks with their `group`); the replica is
    pending there with this command."""
    (command,) = command_queue(
        actor=actor,
        cluster=endpoint.cluster,
        command_type=CommandType.ENDPOINT_START,
        payload=protocol.EndpointStartPayload(
            endpoint_id=replica.server_id,
            model_id=endpoint.model_id,
            revision=endpoint.revision,
            gpus=endpoint.gpus,
            min_vram_mb=endpoint.min_vram_mb,
            extra_args=list(endpoint.server_args),
            adapters=endpoint_adapter_refs(endpoint),
            group=protocol.EndpointGroup() if group is None else group,
        ),
        node=node,
        as_workload=True,
    )
    replica.node, replica.status, replica.port, replica.start_command = node, EndpointStatus.PENDING, 0, command
    replica.failure_code = replica.failure_message = ""
    replica.retired_at = None  # started again: back in rotation once it runs
    replica.save(
        update_fields=[
            "node",
            "status",
            "port",
            "start_command",
            "failure_code",
            "failure_message",
            "retired_at",
            "updated_at",
        ]
    )
    return command


def replica_retire(*, actor: AbstractBaseUser | None, endpoint: Endpoint, replica: EndpointReplica) -> Command | None:
    """Take one replica out of rotation now (the proxy routes no new request to it, and the endpoint's status
    no longer counts it); a running one is stopped by the healing pass ENDPOINT_DRAIN_S later, so the requests
    it still serves finish (`endpoint_heal`), one not yet running is stopped at once (it serves none).
    Returns the stop command queued now, if any. The caller holds the endpoint's row lock."""
    if replica.retired_at is None:
        replica.retired_at = timezone.now()
        replica.save(update_fields=["retired_at", "updated_at"])
    if replica.status in (EndpointStatus.PENDING, EndpointStatus.STARTING):
        return replica_queue_stop(actor=actor, endpoint=endpoint, replica=replica)
    return None


def replica_queue_stop(
    *, actor: AbstractBaseUser | None, endpoint: Endpoint, replica: EndpointReplica
) -> Command | None:
    """Stop one live replica: `endpoint.stop` to its node (→ stopping), or stopped at once without a node."""
    if replica.node_id is None:
        replica.status = EndpointStatus.STOPPED
        replica.save(update_fields=["status", "updated_at"])
        return None
    (command,) = command_queue(
        actor=actor,
        cluster=endpoint.cluster,
        command_type=CommandType.ENDPOINT_STOP,
        payload=protocol.EndpointStopPayload(endpoint_id=replica.server_id),
        node=replica.node,
        as_workload=True,
    )
    replica.status, replica.stop_command = EndpointStatus.STOPPING, command
    replica.save(update_fields=["status", "stop_command", "updated_at"])
    return command


def endpoint_summarise(endpoint: Endpoint) -> Endpoint:
    """Write the endpoint's status, node, port and failure from its replicas; the caller holds its row lock.

    Counted are the current replicas and the replaced ones (by `endpoint_heal`) still live: running
    while any runs, else starting, pending, stopping; once all ended, failed when every one failed, else
    stopped. Replicas taken out of rotation (`replica_retire`) are left out while others remain; an endpoint
    the idle pass scaled to zero (`idle_since`) whose every replica is out of rotation is idle. `node`/`port`
    are the first running replica's (else the first live one's, else left as they were); the failure is a
    failed (else stopped) replica's, once ended.
    """
    if endpoint.distributed:
        return _summarise_group(endpoint)
    replicas = list(
        EndpointReplica.objects.filter(endpoint=endpoint)
        .filter(Q(replacements__isnull=True) | Q(status__in=EndpointStatus.live()))
        .distinct()
        .order_by("created_at", "server_id")
    )
    in_rotation = [r for r in replicas if r.retired_at is None]
    if not in_rotation and endpoint.idle_since is not None:
        endpoint.status = EndpointStatus.IDLE
        endpoint.failure_code = endpoint.failure_message = ""
        endpoint.save(update_fields=["status", "failure_code", "failure_message", "updated_at"])
        return endpoint
    replicas = in_rotation or replicas
    if not replicas:
        return endpoint
    statuses = {r.status for r in replicas}
    status = next((s for s in _PRECEDENCE if s in statuses), EndpointStatus.FAILED)
    if status == EndpointStatus.STOPPED and statuses == {EndpointStatus.FAILED}:
        status = EndpointStatus.FAILED
    lead = next((r for r in replicas if r.status == EndpointStatus.RUNNING), None) or next(
        (r for r in replicas if r.status in EndpointStatus.live()), None
    )
    if lead is not None:
        endpoint.node_id, endpoint.port = lead.node_id, lead.port
    if status in (EndpointStatus.STOPPED, EndpointStatus.FAILED):
        ended = sorted(replicas, key=lambda r: (r.status != EndpointStatus.FAILED, not r.failure_code))
        endpoint.failure_code, endpoint.failure_message = ended[0].failure_code, ended[0].failure_message
    else:
        endpoint.failure_code = endpoint.failure_message = ""
    endpoint.status = status
    endpoint.save(update_fields=["status", "node", "port", "failure_code", "failure_message", "updated_at"])
    return endpoint


def _summarise_group(endpoint: Endpoint) -> Endpoint:
    """A distributed endpoint's status from its ranks, all or nothing: running only while every rank runs; once
    the group failed (`group_failure_code`, written by `services.endpoints.group_health`) stopping while a rank
    is live, then failed with the group's reason; else failed as soon as a rank failed, starting while a rank
    starts, stopping while one stops, else stopped. `node`/`port` are the leader's (rank 0). Counted are the
    current ranks: one left behind stopping on another node (`groups.rank_left_behind`) no longer is."""
    ranks = list(
        EndpointReplica.objects.filter(
            endpoint=endpoint, group_rank__lt=endpoint.pipeline_parallel, replacements__isnull=True
        ).order_by("group_rank")
    )
    if not ranks:
        return endpoint
    statuses = {r.status for r in ranks}
    live = statuses & EndpointStatus.live()
    code, message = "", ""
    if endpoint.group_failure_code == GROUP_STOPPED:
        status = EndpointStatus.STOPPING if live else EndpointStatus.STOPPED
    elif endpoint.group_failure_code:
        status = EndpointStatus.STOPPING if live else EndpointStatus.FAILED
        code, message = endpoint.group_failure_code, endpoint.group_failure
    elif EndpointStatus.FAILED in statuses:  # one rank down takes the group down (its pass stops the others)
        failed = next(r for r in ranks if r.status == EndpointStatus.FAILED)
        status, code, message = EndpointStatus.FAILED, failed.failure_code, failed.failure_message
    elif statuses == {EndpointStatus.RUNNING}:
        status = EndpointStatus.RUNNING
    elif live & {EndpointStatus.PENDING, EndpointStatus.STARTING, EndpointStatus.RUNNING}:
        status = EndpointStatus.STARTING if live - {EndpointStatus.PENDING} else EndpointStatus.PENDING
    elif EndpointStatus.STOPPING in statuses:
        status = EndpointStatus.STOPPING
    else:
        status = EndpointStatus.STOPPED
    leader = ranks[0]
    endpoint.node_id, endpoint.port = leader.node_id, leader.port
    endpoint.status, endpoint.failure_code, endpoint.failure_message = status, code, message
    endpoint.save(update_fields=["status", "node", "port", "failure_code", "failure_message", "updated_at"])
    return endpoint

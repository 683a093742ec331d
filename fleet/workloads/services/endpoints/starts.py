"""endpoint.start commands as they are queued, whoever sent them (these services, the Commands tab, the API):
each gets its replica (and its endpoint, when new), admitted against the workspace's quotas."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from agent import protocol
from fleet.models import Command
from fleet.payloads import MARKS
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.quotas import replica_ask, replica_hold
from fleet.workloads.services.endpoints.events import endpoint_event_record
from fleet.workloads.services.endpoints.replicas import endpoint_summarise
from fleet.workloads.services.endpoints.validation import validate_server_args
from tenancy.quotas import admit


def _replica_ask(held: tuple[int, int], covered: tuple[int, int] = (0, 0)) -> dict[str, float]:
    """What a replica holding `held` (`replica_hold`: GPUs, VRAM MB) asks of the quotas, less `covered` (what
    of it a rank's Ray node already holds: `EndpointReplica.covered_*`)."""
    return replica_ask(gpus=held[0] - covered[0], min_vram_mb=held[1] - covered[1])


def _covered(replica: EndpointReplica, held: tuple[int, int]) -> tuple[int, int]:
    """What of `held` the replica's Ray node already holds (a rank's, set by `group_start`; else nothing)."""
    return min(replica.covered_gpus, held[0]), min(replica.covered_vram_mb, held[1])


def endpoint_record_start_commands(*, commands: list[Command]) -> list[Endpoint]:
    """endpoint.start commands queued (by the services here, or sent from the Commands tab / API): each
    gets the replica its `endpoint_id` names (a replica's server id; an endpoint's slug names its first
    replica), created with its Endpoint row when new, or made pending again on the command's node when it
    had stopped or failed, so every started server is listed with its endpoint's URL.

    Refuses (ValidationError) a start sent to several nodes at once, and an id of another cluster's or a
    still live replica on another node. Each replica that goes live is admitted against the workspace's
    quotas as its start is queued (`QuotaExceeded`): the GPUs and VRAM its server will hold on the command's
    node (`fleet.workloads.quotas.replica_hold`: at least one GPU on a GPU node) beyond what a rank's Ray node
    already holds (`covered_*`, set by `group_start`), and the endpoint itself
    when it was neither live nor scaled to zero (`EndpointStatus.kept()`); a live replica counts already,
    starting it again asks nothing. A replica started again comes back into rotation (and its endpoint awake).
    """
    if len(commands) > 1:
        raise ValidationError({"node_id": "An endpoint starts on one node: choose the node."})
    rows = []
    for command in commands:
        if "extra_args" in ((command.payload or {}).get(MARKS) or ()):
            raise ValidationError(
                {
                    f"payload.{MARKS}": "An endpoint keeps its server arguments (extra_args) to start every "
                    "replica with, shown to its workspace: they cannot be secret."
                }
            )
        payload: protocol.EndpointStartPayload | None = command.parsed_payload
        if payload is None:  # (queued commands were validated: only a row written by hand gets here)
            raise ValidationError({"payload": "Not an endpoint.start payload."})
        server_args = validate_server_args(payload.extra_args, "payload.extra_args")
        # What the server will really hold on its node (at least one GPU on a GPU node), counted as admitted.
        held = replica_hold(payload, command.node)
        server_id = payload.endpoint_id
        found = EndpointReplica.objects.filter(server_id=server_id).values_list("endpoint_id", flat=True).first()
        endpoint = (
            Endpoint.objects.select_for_update().filter(pk=found).first()
            if found
            else Endpoint.objects.select_for_update().filter(slug=server_id).first()
        )
        if endpoint is not None and endpoint.cluster_id != command.cluster_id:
            raise ValidationError({"payload.endpoint_id": "No such endpoint in this cluster."})
        created = endpoint is None
        if endpoint is None:
            admit(workspace_id=command.cluster.workspace_id, ask={"endpoints": 1, **_replica_ask(held)})
            endpoint = Endpoint.objects.create(
                slug=server_id,
                cluster_id=command.cluster_id,
                node_id=command.node_id,
                model_id=payload.model_id,
                revision=payload.revision,
                gpus=payload.gpus,
                min_vram_mb=payload.min_vram_mb,
                server_args=server_args,
                created_by=command.created_by,
                start_command=command,
            )
            endpoint_event_record(
                endpoint=endpoint,
                node_id=command.node_id,
                kind="endpoint.starting",
                message=f"Endpoint {endpoint.hostname} for {endpoint.model_id}@{endpoint.revision} requested by "
                f"{command.created_by.get_username() if command.created_by else 'the control plane'}",
                command=command,
            )
        replica = EndpointReplica.objects.select_for_update().filter(server_id=server_id).first()
        if replica is None:
            if not created:
                admit(workspace_id=command.cluster.workspace_id, ask=_replica_ask(held))
            EndpointReplica.objects.create(
                endpoint=endpoint,
                server_id=server_id,
                node_id=command.node_id,
                start_command=command,
                held_gpus=held[0],
                held_vram_mb=held[1],
            )
        elif replica.start_command_id is None:
            # a replica the services here just made: it counts once they link this command to it
            covered = _covered(replica, held)
            admit(workspace_id=command.cluster.workspace_id, ask=_replica_ask(held, covered))
            EndpointReplica.objects.filter(pk=replica.pk).update(
                held_gpus=held[0], held_vram_mb=held[1], covered_gpus=covered[0], covered_vram_mb=covered[1]
            )
        elif replica.status in (EndpointStatus.STOPPED, EndpointStatus.FAILED):
            covered = _covered(replica, held)
            ask = _replica_ask(held, covered)
            if endpoint.status not in EndpointStatus.kept():  # an idle endpoint counts already
                ask["endpoints"] = 1
            admit(workspace_id=command.cluster.workspace_id, ask=ask)
            replica.status, replica.node_id, replica.port = EndpointStatus.PENDING, command.node_id, 0
            replica.start_command, replica.failure_code, replica.failure_message = command, "", ""
            replica.retired_at = None
            replica.held_gpus, replica.held_vram_mb = held
            replica.covered_gpus, replica.covered_vram_mb = covered
            replica.save()
            endpoint.model_id = payload.model_id
            endpoint.revision = payload.revision
            endpoint.server_args = server_args
            endpoint.start_command, endpoint.idle_since = command, None
            endpoint.save(
                update_fields=["model_id", "revision", "server_args", "start_command", "idle_since", "updated_at"]
            )
        elif replica.node_id != command.node_id:
            raise ValidationError({"payload.endpoint_id": f"This endpoint is {replica.status} on another node."})
        rows.append(endpoint_summarise(endpoint))
    return rows

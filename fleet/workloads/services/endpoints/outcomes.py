"""The rows following a replica's commands: endpoint.start taken (starting), and endpoint.start / endpoint.stop
finished (running with its port, stopped, or failed with why), the endpoint summarising its replicas again."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from agent import protocol
from fleet.models import Command, CommandStatus, CommandType
from fleet.workloads.errors import error_help, error_sentence
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.services.common import system_actor
from fleet.workloads.services.endpoints.adapters import replica_sync_adapters
from fleet.workloads.services.endpoints.cold_starts import replica_record_start_phases
from fleet.workloads.services.endpoints.events import endpoint_event_record
from fleet.workloads.services.endpoints.replicas import endpoint_summarise
from fleet.workloads.services.endpoints.strays import server_stop_unowned
from fleet.workloads.services.endpoints.updates import endpoint_update_failed
from fleet.workloads.services.endpoints.validation import valid_port

_ENDED = (EndpointStatus.STOPPED, EndpointStatus.FAILED)


def endpoint_record_acked(*, command: Command) -> Endpoint | None:
    """The agent took a replica's endpoint.start: pending → starting."""
    if command.command_type != CommandType.ENDPOINT_START:
        return None
    endpoint_id = EndpointReplica.objects.filter(start_command=command).values_list("endpoint_id", flat=True).first()
    if endpoint_id is None:
        return None
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update().get(pk=endpoint_id)
        EndpointReplica.objects.filter(start_command=command, status=EndpointStatus.PENDING).update(
            status=EndpointStatus.STARTING, updated_at=timezone.now()
        )
        return endpoint_summarise(endpoint)


def _replica_of(command: Command, field: str) -> EndpointReplica | None:
    replica = EndpointReplica.objects.filter(**{field: command}).first()
    if replica is None:
        payload: protocol.EndpointStartPayload | protocol.EndpointStopPayload | None = command.parsed_payload
        server_id = payload.endpoint_id if payload is not None else ""
        replica = EndpointReplica.objects.filter(server_id=server_id, endpoint__cluster_id=command.cluster_id).first()
    return replica


def endpoint_record_command_outcome(*, command: Command) -> Endpoint | None:
    """A replica's endpoint.start / endpoint.stop finished: running with its port, stopped, or failed with
    the code (a failed replica whose server was told to stop stays failed); the endpoint summarises its
    replicas again."""
    if command.command_type not in (CommandType.ENDPOINT_START, CommandType.ENDPOINT_STOP):
        return None
    field = "start_command" if command.command_type == CommandType.ENDPOINT_START else "stop_command"
    found = _replica_of(command, field)
    if found is None:
        return None
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update().get(pk=found.endpoint_id)
        replica = EndpointReplica.objects.select_for_update().get(pk=found.pk)
        ok = command.status == CommandStatus.SUCCEEDED
        if command.command_type == CommandType.ENDPOINT_START:
            if replica.status not in (EndpointStatus.PENDING, EndpointStatus.STARTING):
                if ok and replica.start_command_id == command.pk and replica.status in _ENDED:
                    # stopped or failed while starting (its stop reached the agent first: `not_found`): the
                    # server this start left running has no replica any more
                    server_stop_unowned(
                        node=command.node,
                        server_id=replica.server_id,
                        why=f"started after replica {replica.server_id} was {replica.status}",
                        endpoint=endpoint,
                    )
                return endpoint  # stopped meanwhile, or a duplicate outcome
            result: protocol.EndpointStartResult | None = command.parsed_result
            port = valid_port(result.port if result is not None else None)
            if ok and (port or replica.group_role == "follower"):  # a follower rank serves no HTTP
                replica.status, replica.port = EndpointStatus.RUNNING, port
                replica.failure_code = replica.failure_message = ""
                replica.adapters = list(result.adapters or [])
                endpoint_event_record(
                    endpoint=endpoint,
                    node_id=command.node_id,
                    kind="endpoint.running",
                    message=f"Endpoint {endpoint.url}: replica {replica.server_id} is running on port {port}",
                    command=command,
                )
                if result.phases is not None:
                    replica_record_start_phases(
                        endpoint=endpoint, replica=replica, command=command, phases=result.phases
                    )
                replica.save()
                if endpoint.adapter_links.exists():  # adapters attached (or detached) while it started
                    actor = system_actor(endpoint.cluster.workspace)
                    replica_sync_adapters(actor=actor, endpoint=endpoint, replica=replica)
            else:
                code = command.error_code if not ok else "internal"
                message = command.error_message if not ok else "The agent reported success without a valid port."
                replica.status = EndpointStatus.FAILED
                replica.failure_code, replica.failure_message = code, message
                endpoint_event_record(
                    endpoint=endpoint,
                    node_id=command.node_id,
                    kind="endpoint.failed",
                    message=f"Endpoint {endpoint.hostname}: replica {replica.server_id} failed to start: "
                    f"{error_sentence(code, message)}",
                    data={"error_help": error_help(code)},
                    command=command,
                )
                replica.save()  # failed, before the update is called off (`endpoint_update_failed`)
                endpoint_update_failed(endpoint=endpoint, replica=replica, command=command)
        elif replica.status == EndpointStatus.FAILED:  # the stop of a failed replica's server (a hung one)
            if ok or command.error_code == "not_found":
                endpoint_event_record(
                    endpoint=endpoint,
                    node_id=command.node_id,
                    kind="endpoint.stopped",
                    message=f"Endpoint {endpoint.hostname}: the server of failed replica {replica.server_id} stopped",
                    command=command,
                )
            else:
                endpoint_event_record(
                    endpoint=endpoint,
                    node_id=command.node_id,
                    kind="endpoint.failed",
                    message=f"Endpoint {endpoint.hostname}: the server of failed replica {replica.server_id} "
                    f"could not be stopped: {error_sentence(command.error_code, command.error_message)}",
                    data={"error_help": error_help(command.error_code)},
                    command=command,
                )
            return endpoint  # it stays failed, with why
        elif ok or command.error_code == "not_found":
            replica.status = EndpointStatus.STOPPED
            endpoint_event_record(
                endpoint=endpoint,
                node_id=command.node_id,
                kind="endpoint.stopped",
                message=f"Endpoint {endpoint.hostname}: replica {replica.server_id} stopped",
                command=command,
            )
            if not ok and _started_after(replica, command):  # the start ran after this stop found nothing
                server_stop_unowned(
                    node=command.node,
                    server_id=replica.server_id,
                    why=f"started after replica {replica.server_id}'s stop found nothing to stop",
                    endpoint=endpoint,
                )
        else:
            replica.status = EndpointStatus.RUNNING if replica.port else EndpointStatus.FAILED
            replica.failure_code, replica.failure_message = command.error_code, command.error_message
            endpoint_event_record(
                endpoint=endpoint,
                node_id=command.node_id,
                kind="endpoint.failed",
                message=f"Endpoint {endpoint.hostname}: replica {replica.server_id} could not be stopped: "
                f"{error_sentence(command.error_code, command.error_message)}",
                data={"error_help": error_help(command.error_code)},
                command=command,
            )
        replica.save()
        return endpoint_summarise(endpoint)


def _started_after(replica: EndpointReplica, stop: Command) -> bool:
    """The replica's start succeeded after `stop` was sent (the stop reached the agent before the start)."""
    start = replica.start_command
    return (
        start is not None
        and start.status == CommandStatus.SUCCEEDED
        and start.finished_at is not None
        and start.finished_at >= stop.created_at
    )

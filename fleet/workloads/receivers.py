"""How workloads follow the fleet core: receivers of the core's signals, connected at app start.

The core services (`fleet.services`) never import workloads: they send `fleet.signals` and these
receivers reconcile containers, cached models and endpoints from inventories, follow command acks and
outcomes, let drains take their next step, and enqueue the drain passes the core asks for.
"""

from __future__ import annotations

import logging

from django.db import transaction

from agent import protocol
from fleet import enqueue, signals
from fleet.models import Command, CommandStatus, CommandType, Node
from fleet.workloads import drain, quotas
from fleet.workloads.models import Container
from fleet.workloads.services import (
    REF_OUTCOME,
    container_record_create_failed,
    container_record_created,
    container_record_ref_outcome,
    containers_reconcile,
    containers_record_queued,
    containers_record_start_queued,
    endpoint_record_acked,
    endpoint_record_adapter_outcome,
    endpoint_record_command_outcome,
    endpoint_record_start_commands,
    endpoints_end_with_node,
    endpoints_lock_for_commands,
    endpoints_reconcile,
    node_model_record_download_failed,
    node_model_record_downloaded,
    node_model_record_evicted,
    node_models_reconcile,
    node_models_record_queued,
)

logger = logging.getLogger(__name__)


def connect() -> None:
    """Connect the receivers (called from `FleetConfig.ready()`; idempotent), and hand tenancy what
    containers and endpoints count against workspace quotas."""
    quotas.register()
    signals.inventory_received.connect(_on_inventory, dispatch_uid="fleet.workloads.inventory")
    signals.command_reports_locking.connect(_on_command_reports_locking, dispatch_uid="fleet.workloads.reports_locking")
    signals.command_acked.connect(_on_command_acked, dispatch_uid="fleet.workloads.command_acked")
    signals.command_finished.connect(_on_command_finished, dispatch_uid="fleet.workloads.command_finished")
    signals.commands_queued.connect(_on_commands_queued, dispatch_uid="fleet.workloads.commands_queued")
    signals.drain_requested.connect(_on_drain_requested, dispatch_uid="fleet.workloads.drain_requested")
    signals.node_deleting.connect(_on_node_deleting, dispatch_uid="fleet.workloads.node_deleting")


def _on_node_deleting(sender: object, node: Node, reachable: bool, **kwargs: object) -> None:
    """Inside the delete's transaction: the node's endpoints stop with it (or are marked lost)."""
    endpoints_end_with_node(node=node, reachable=reachable)


def _on_drain_requested(sender: object, node: Node, **kwargs: object) -> None:
    """`node_drain` left the node draining with containers on it: one drain pass for it after commit."""
    enqueue.on_commit(drain.DRAIN_TASK, str(node.pk))


def _on_commands_queued(sender: object, commands: list[Command], **kwargs: object) -> None:
    """Inside the queueing transaction: container.create, container.start of a container that holds no
    quota and endpoint.start are admitted against the workspace's quotas and get or mark their rows (a
    refusal rolls the queueing back); model.download gets its node's cache budget, model.evict is refused while
    an endpoint serves from the snapshot."""
    if commands and commands[0].command_type == CommandType.CONTAINER_CREATE:
        containers_record_queued(commands=commands)
    elif commands and commands[0].command_type == CommandType.CONTAINER_START:
        containers_record_start_queued(commands=commands)
    elif commands and commands[0].command_type == CommandType.ENDPOINT_START:
        endpoint_record_start_commands(commands=commands)
    elif commands and commands[0].command_type in (CommandType.MODEL_DOWNLOAD, CommandType.MODEL_EVICT):
        node_models_record_queued(commands=commands)


def _on_inventory(sender: object, node: Node, inventory: protocol.Inventory, **kwargs: object) -> None:
    """Inside the inventory's transaction: a failure here fails the inventory write too, as it must."""
    workloads_on_inventory(node=node, inventory=inventory)


def _on_command_reports_locking(sender: object, command_ids: list[object], **kwargs: object) -> None:
    """Before a batch of reports locks its nodes and commands: the endpoints its hooks will lock, first."""
    endpoints_lock_for_commands(command_ids=command_ids)


def _on_command_acked(sender: object, command: Command, **kwargs: object) -> None:
    if not has_ack_hook(command):  # saves a savepoint for every other ack
        return
    try:
        with transaction.atomic():  # a savepoint: a failing hook never loses the recorded ack
            workloads_on_command_acked(command=command)
    except Exception:
        logger.exception("workload hook failed after ack of command %s", command.pk)


def _on_command_finished(sender: object, command: Command, **kwargs: object) -> None:
    try:
        with transaction.atomic():  # a savepoint: a failing hook never loses the recorded outcome
            workloads_on_command_finished(command=command)
    except Exception:
        logger.exception("workload hook failed after command %s finished", command.pk)


def workloads_on_inventory(*, node: Node, inventory: protocol.Inventory) -> None:
    """Reconcile containers, cached models and endpoints from an inventory (hello or inventory frame)."""
    containers_reconcile(node=node, inventory=inventory)
    node_models_reconcile(node=node, inventory=inventory)
    endpoints_reconcile(node=node, inventory=inventory)
    drain.drain_step_for_related(node_ids=[node.pk])


def has_ack_hook(command: Command) -> bool:
    """Whether `workloads_on_command_acked` does anything for this command (saves a savepoint if not)."""
    return command.command_type == CommandType.ENDPOINT_START


def workloads_on_command_acked(*, command: Command) -> None:
    """A command was acknowledged by the agent (endpoint.start: pending → starting)."""
    if command.command_type == CommandType.ENDPOINT_START:
        endpoint_record_acked(command=command)


def workloads_on_command_finished(*, command: Command) -> None:
    """Route a finished (succeeded or failed) command to the recorder of the rows it concerns, then let
    any drain it belongs to take its next step."""
    if command.status not in CommandStatus.terminal():
        return
    kind = command.command_type
    if kind == CommandType.CONTAINER_CREATE:
        row = (
            container_record_created(command=command)
            if command.status == CommandStatus.SUCCEEDED
            else container_record_create_failed(command=command)
        )
        if row is not None and row.replacement_of_id:
            original_node = Container.objects.filter(pk=row.replacement_of_id).values_list("node_id", flat=True)
            drain.drain_step_for_related(node_ids=list(original_node))
    elif kind in REF_OUTCOME:
        container_record_ref_outcome(command=command)
        drain.drain_step_for_related(node_ids=[command.node_id])
    elif kind in (CommandType.ENDPOINT_START, CommandType.ENDPOINT_STOP):
        endpoint_record_command_outcome(command=command)
    elif kind in (CommandType.ENDPOINT_ADAPTER_LOAD, CommandType.ENDPOINT_ADAPTER_UNLOAD):
        endpoint_record_adapter_outcome(command=command)
    elif kind == CommandType.MODEL_DOWNLOAD and command.status == CommandStatus.SUCCEEDED:
        node_model_record_downloaded(command=command)
    elif kind == CommandType.MODEL_DOWNLOAD and command.status == CommandStatus.FAILED:
        node_model_record_download_failed(command=command)
    elif kind == CommandType.MODEL_EVICT:
        node_model_record_evicted(command=command)

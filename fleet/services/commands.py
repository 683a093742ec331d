"""Commands: the status machine (`command_transition`, the one owner of Command status changes) and
queueing (`command_dispatch` for operators, `command_queue` for automatic work)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from audit.services import Target, entry_for_commands, operator_action, target_of
from fleet import enqueue, signals
from fleet.models import Command, CommandStatus, CommandType, ComputeCluster, Node, NodeEvent, NodeStatus
from fleet.payloads import OWNED_COMMANDS, split_secrets, validate_payload
from kernel.exceptions import IllegalTransition
from tenancy.mixins import require_editor, require_operator
from tenancy.quotas import locked_quota

# Commands that put new work on a node; refused for cordoned and draining nodes.
SCHEDULING_COMMANDS = frozenset(
    {
        CommandType.CONTAINER_CREATE,
        CommandType.ENDPOINT_START,
        CommandType.MODEL_DOWNLOAD,
        CommandType.RAY_HEAD_START,
        CommandType.RAY_WORKER_START,
    }
)
# Commands admitted against the workspace's quotas (by the apps that follow `commands_queued` or queue them):
# the quota row is locked before the node row, so admissions and node locks never wait in a circle.
ADMITTED_COMMANDS = frozenset(
    {
        CommandType.CONTAINER_CREATE,
        CommandType.CONTAINER_START,
        CommandType.ENDPOINT_START,
        CommandType.RAY_HEAD_START,
        CommandType.RAY_WORKER_START,
    }
)
# For each status, the statuses a command may reach it from (`command_transition`, `command_record_reports`).
COMMAND_MOVES: dict[str, frozenset[str]] = {
    CommandStatus.DISPATCHED: frozenset({CommandStatus.QUEUED}),
    CommandStatus.RUNNING: frozenset({CommandStatus.QUEUED, CommandStatus.DISPATCHED}),
    CommandStatus.SUCCEEDED: frozenset({CommandStatus.QUEUED, CommandStatus.DISPATCHED, CommandStatus.RUNNING}),
    CommandStatus.FAILED: frozenset({CommandStatus.QUEUED, CommandStatus.DISPATCHED, CommandStatus.RUNNING}),
    CommandStatus.QUEUED: frozenset({CommandStatus.DISPATCHED}),  # un-claim after a failed send
}
# The timestamp column each status sets.
COMMAND_TIMESTAMP = {
    CommandStatus.DISPATCHED: "dispatched_at",
    CommandStatus.RUNNING: "acked_at",
    CommandStatus.SUCCEEDED: "finished_at",
    CommandStatus.FAILED: "finished_at",
}


def command_transition(
    *, command_id: uuid.UUID | str, to: str, node_id: uuid.UUID | str | None = None, **fields: Any
) -> Command | None:
    """Move a command to `to` with a conditional UPDATE; the one owner of Command status changes.

    Returns the updated command, or None when nothing changed: the row does not exist (or belongs to
    another node than `node_id`), or it already is in `to` (an exact duplicate, ignored). Raises
    `IllegalTransition` for any other move (e.g. succeeded → running).
    """
    rows = Command.objects.filter(pk=command_id)
    if node_id is not None:
        rows = rows.filter(node_id=node_id)
    now = timezone.now()
    stamp = COMMAND_TIMESTAMP.get(to)
    if stamp:
        fields.setdefault(stamp, now)
    updated = rows.filter(status__in=list(COMMAND_MOVES[to])).update(status=to, **fields)
    if updated:
        return rows.get()
    current = rows.values_list("status", flat=True).first()
    if current is None or current == to:
        return None
    raise IllegalTransition(f"A {current} command cannot become {to}.")


def _dispatch_detail(kwargs: dict[str, Any], commands: list[Command] | None) -> dict[str, Any]:
    node = kwargs.get("node")
    detail: dict[str, Any] = {"command_type": str(kwargs.get("command_type"))[:32], "node": node.name if node else None}
    if commands:
        detail.update(batch_id=str(commands[0].batch_id), commands=len(commands))
    return detail


# The commands a workload's own service queues as part of an action a Member may take (start and stop an
# endpoint's replicas; submit, stop and poll a Ray job, poll Serve): `command_queue(as_workload=True)`. Sent
# by hand (command_dispatch: the Commands tab and API) every command stays Owner/Admin only.
WORKLOAD_COMMANDS = frozenset(
    {
        CommandType.ENDPOINT_START,
        CommandType.ENDPOINT_STOP,
        CommandType.ENDPOINT_ADAPTER_LOAD,
        CommandType.ENDPOINT_ADAPTER_UNLOAD,
        CommandType.RAY_JOB_SUBMIT,
        CommandType.RAY_JOB_STATUS,
        CommandType.RAY_JOB_STOP,
        CommandType.RAY_SERVE_STATUS,
    }
)


def _dispatch_target(kwargs: dict[str, Any]) -> Target:
    """The node, or the cluster for a fan-out; in the cluster's workspace either way."""
    cluster, node = kwargs["cluster"], kwargs.get("node")
    if node is None:
        return target_of(cluster, "cluster")
    return Target("node", str(node.pk), node.name, cluster.workspace_id)


@operator_action("command.dispatch", target=_dispatch_target, detail=_dispatch_detail)
def command_dispatch(
    *,
    actor: AbstractBaseUser,
    cluster: ComputeCluster,
    command_type: str,
    payload: dict[str, Any] | Any,
    node: Node | None = None,
) -> list[Command]:
    """An operator sends `command_type` to one node or every online node of `cluster` (audited; the
    entry follows the commands to their outcome). Otherwise as `command_queue`. A command type an app owns
    (`fleet.payloads.OWNED_COMMANDS`: the Ray apps' `ray.*`) is refused (ValidationError on `command_type`,
    naming the API that sends it): only that app's services send it, admitted and recorded."""
    if command_type in OWNED_COMMANDS:
        owner = OWNED_COMMANDS[command_type]
        said = f"{command_type} is not sent through the command API: use {owner}, which sends it itself."
        raise ValidationError({"command_type": said})
    return command_queue(actor=actor, cluster=cluster, command_type=command_type, payload=payload, node=node)


def command_queue(
    *,
    actor: AbstractBaseUser,
    cluster: ComputeCluster,
    command_type: str,
    payload: dict[str, Any] | Any,
    node: Node | None = None,
    as_workload: bool = False,
) -> list[Command]:
    """Queue `command_type` for one node or for every online node of `cluster`; returns at once. `payload`:
    a JSON object, or the command type's protocol dataclass (`fleet.payloads.validate_payload` checks both).

    No audit entry of its own: automatic work (drains, the Ray autoscaler and follow-ups) calls it, and
    so do services that send commands as part of a larger operator action (the commands then point at
    that action's entry). Commands queued outside any operator action are the control plane's own:
    marked `system`, credited to no user (`actor` is only whose rights they run with).
    Owner/Admin only; with `as_workload` (a workload service queuing a workload's own command,
    `WORKLOAD_COMMANDS`, for an action a Member may take) Owner, Admin or Member. One Command row per
    target node (shared `batch_id`, own idempotency key); on commit one Celery task is enqueued:
    `dispatch_command` for a single target, `dispatch_batch` for several. A single offline node still gets
    its command: it stays queued and is delivered when the node reconnects. Cordoned and draining nodes refuse new work.
    """
    if as_workload:
        if command_type not in WORKLOAD_COMMANDS:
            raise ValueError(f"{command_type} is not a workload command")
        require_editor(actor, cluster.workspace, what="run workloads")
    else:
        require_operator(actor, cluster.workspace)
    clean = validate_payload(command_type, payload)
    public, secret = split_secrets(clean)
    with transaction.atomic():
        if command_type in ADMITTED_COMMANDS:
            locked_quota(cluster.workspace_id)  # first: the lock order of admissions (tenancy.quotas)
        if node is not None:
            if node.cluster_id != cluster.pk:
                raise ValidationError({"node_id": "This node is not in this cluster."})
            node = Node.objects.select_for_update().filter(pk=node.pk).first()
            if node is None:
                raise IllegalTransition("This node no longer exists.")
            if command_type in SCHEDULING_COMMANDS and node.status in (NodeStatus.CORDONED, NodeStatus.DRAINING):
                raise IllegalTransition(f"The node is {node.status}: it takes no new {command_type} commands.")
            targets = [node]
        else:
            targets = list(Node.objects.filter(cluster=cluster, status=NodeStatus.ONLINE).order_by("pk"))
            if not targets:
                raise IllegalTransition("No online nodes in this cluster.")
        batch_id = uuid.uuid4()
        audit_entry = entry_for_commands()
        system = audit_entry is None  # not part of an operator action: the control plane's own work
        commands = [
            Command(
                node=target,
                cluster=cluster,
                batch_id=batch_id,
                command_type=command_type,
                payload=public,
                secrets=json.dumps(secret) if secret else "",
                idempotency_key=uuid.uuid4().hex,
                created_by=None if system else actor,
                system=system,
                audit_entry_id=audit_entry,
            )
            for target in targets
        ]
        Command.objects.bulk_create(commands)
        signals.commands_queued.send(sender=Command, commands=commands)
        NodeEvent.objects.bulk_create(
            [
                NodeEvent(
                    node_id=c.node_id,
                    kind="command.queued",
                    message=f"{command_type} queued by {'system' if system else actor.get_username()}",
                    command=c,
                )
                for c in commands
            ]
        )
        if len(commands) == 1:
            enqueue.dispatch_command(commands[0].pk)
        else:  # one task claims and sends the whole batch (fan-out to All nodes)
            enqueue.dispatch_batch(batch_id)
    return commands

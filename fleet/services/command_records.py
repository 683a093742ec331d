"""What agents report about their commands (ack, progress, result, error), recorded one at a time or in
batches (`CommandReport`, `command_record_reports`), and the follow-ups of each recorded move."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone

from audit.services import (
    entry_settle,
)
from fleet import signals
from fleet.models import COMMAND_OPEN_STATUSES, Command, CommandStatus, Node, NodeEvent
from fleet.services.commands import COMMAND_MOVES, COMMAND_TIMESTAMP
from fleet.services.events import node_event_record
from kernel import metrics
from kernel.exceptions import IllegalTransition

logger = logging.getLogger(__name__)


def _after_command_acked(command: Command) -> None:
    """Let the rows a command concerns follow its ack (receivers of `fleet.signals.command_acked`)."""
    signals.command_acked.send(sender=Command, command=command)


def _after_command_finished(command: Command) -> None:
    """Once an outcome is recorded: workloads, drains and other apps (raymgr) follow it.

    Every receiver of `fleet.signals.command_finished` runs in a savepoint of its own and logs its
    failures, so a failing follow-up rolls back only its own writes, never the outcome.
    """
    try:
        with transaction.atomic():
            signals.command_finished.send(sender=Command, command=command)
    except Exception:
        logger.exception("command_finished receiver failed for command %s", command.pk)


def command_record_ack(*, node: Node, command_id: uuid.UUID | str, duplicate: bool = False) -> Command | None:
    """Agent acknowledged: → running. Frames about other nodes' commands are ignored (None)."""
    return _record_one(CommandReport.ack(node.pk, command_id, duplicate=duplicate))


def command_record_progress(
    *,
    node: Node,
    command_id: uuid.UUID | str,
    message: str,
    percent: float | None = None,
    data: dict[str, Any] | None = None,
) -> NodeEvent | None:
    """A progress step of a command: one event in the node's log (status untouched)."""
    command = Command.objects.filter(pk=command_id, node_id=node.pk).first()
    if command is None:
        logger.warning("progress for foreign or unknown command %s from node %s ignored", command_id, node.pk)
        return None
    text = message[:2000] + (f" ({percent:.0f}%)" if percent is not None else "")
    return node_event_record(
        node_id=node.pk,
        kind="command.progress",
        message=text,
        data={"percent": percent, **(data or {})},
        command=command,
    )


def command_record_result(*, node: Node, command_id: uuid.UUID | str, data: dict[str, Any]) -> Command | None:
    """Command succeeded: → succeeded with `data` stored as its result."""
    return _record_one(CommandReport.result(node.pk, command_id, data))


def command_record_error(
    *, node: Node, command_id: uuid.UUID | str, code: str, message: str, data: dict[str, Any] | None = None
) -> Command | None:
    """Command failed: → failed with its error code and message."""
    return _record_one(CommandReport.error(node.pk, command_id, code=code, message=message, data=data))


@dataclass(frozen=True)
class CommandReport:
    """What an agent reported about one of its commands: ack (→ running), result (→ succeeded), error."""

    node_id: uuid.UUID
    command_id: Any
    to: str
    fields: dict[str, Any]
    event_suffix: str  # the event message is the command type followed by this
    event_data: dict[str, Any]

    @classmethod
    def ack(cls, node_id: uuid.UUID, command_id: Any, *, duplicate: bool = False) -> CommandReport:
        note = " (already done before: duplicate delivery)" if duplicate else ""
        return cls(node_id, command_id, CommandStatus.RUNNING, {}, f" started{note}", {})

    @classmethod
    def result(cls, node_id: uuid.UUID, command_id: Any, data: dict[str, Any]) -> CommandReport:
        return cls(node_id, command_id, CommandStatus.SUCCEEDED, {"result": data}, " succeeded", data)

    @classmethod
    def error(
        cls, node_id: uuid.UUID, command_id: Any, *, code: str, message: str, data: dict[str, Any] | None = None
    ) -> CommandReport:
        fields = {"error_code": code[:64], "error_message": message[:4000], "result": data or {}}
        return cls(node_id, command_id, CommandStatus.FAILED, fields, f" failed: {code}: {message[:500]}", data or {})


_REPORT_COLUMNS = {
    CommandStatus.RUNNING: ["status", "acked_at"],
    CommandStatus.SUCCEEDED: ["status", "finished_at", "result"],
    CommandStatus.FAILED: ["status", "finished_at", "error_code", "error_message", "result"],
}


def command_record_reports(*, reports: list[CommandReport]) -> list[Command | Exception | None]:
    """Record many agents' reports at once, in one transaction: the batched form of the three above.

    For tunnels that report at the same moment (a fan-out to All nodes): one locking SELECT, one
    UPDATE per kind of report and one INSERT of events for the whole batch, then each command's
    follow-up hooks. Per report the same outcome as its single form: the updated Command, None
    (unknown, another node's command, or already in that state), or the exception the single form
    raises (IllegalTransition, ValidationError) — returned, not raised, so one bad report never fails
    the others. Reports are applied in order, so an ack and a result of one command may share a batch.
    """
    outcomes: list[Command | Exception | None] = [None] * len(reports)
    wanted: dict[int, uuid.UUID] = {}
    for i, report in enumerate(reports):
        try:
            wanted[i] = uuid.UUID(str(report.command_id))
        except (ValueError, TypeError):
            outcomes[i] = ValidationError({"command_id": "Must be a UUID."})
    if not wanted:
        return outcomes
    with transaction.atomic():
        ids = set(wanted.values())
        _lock_in_order(ids)
        rows = {c.pk: c for c in Command.objects.select_for_update().filter(pk__in=ids).order_by("pk")}
        now = timezone.now()
        changed: dict[str, dict[uuid.UUID, Command]] = {to: {} for to in _REPORT_COLUMNS}
        moves: list[tuple[CommandReport, Command]] = []
        for i, command_id in wanted.items():
            report = reports[i]
            command = rows.get(command_id)
            if command is None or command.node_id != report.node_id:
                logger.warning(
                    "node %s reported on command %s that is not its own; ignored", report.node_id, command_id
                )
            elif command.status == report.to:
                pass  # a duplicate report: nothing changes
            elif command.status not in COMMAND_MOVES[report.to]:
                outcomes[i] = IllegalTransition(f"A {command.status} command cannot become {report.to}.")
            else:
                command.status = report.to
                setattr(command, COMMAND_TIMESTAMP[report.to], now)
                for name, value in report.fields.items():
                    setattr(command, name, value)
                command.parse_result()  # once, here: the receivers of command_finished read it typed
                changed[report.to][command.pk] = command
                moves.append((report, command))
                outcomes[i] = command
        for to, commands in changed.items():
            if commands:
                Command.objects.bulk_update(list(commands.values()), _REPORT_COLUMNS[to])
        NodeEvent.objects.bulk_create(
            [
                NodeEvent(
                    node_id=command.node_id,
                    kind=f"command.{report.to}",
                    message=command.command_type + report.event_suffix,
                    data=report.event_data,
                    command=command,
                )
                for report, command in moves
            ]
        )
        _audit_follow(moves)
        for report, command in moves:
            if report.to == CommandStatus.RUNNING:
                _after_command_acked(command)
            else:
                _after_command_finished(command)
    for report, command in moves:
        if report.to == CommandStatus.RUNNING and command.dispatched_at is not None:
            latency = (command.acked_at - command.dispatched_at).total_seconds()
            metrics.COMMAND_ACK_SECONDS.labels(type=command.command_type).observe(max(0.0, latency))
    return outcomes


_NODES_KEY_SHARE = (
    "SELECT 1 FROM {nodes} WHERE id IN (SELECT node_id FROM {commands} WHERE id = ANY(%s::uuid[])) "
    "ORDER BY id FOR KEY SHARE"
)


def _lock_in_order(ids: set[uuid.UUID]) -> None:
    """Before the commands themselves: what the follow-ups lock (endpoints, through
    `signals.command_reports_locking`), then the commands' nodes (key share, as the events inserted
    below take it), in the fleet's one lock order (docs/architecture.md: endpoints, nodes, commands).

    Without it, the batch held its commands and their nodes and then waited for an endpoint that
    `endpoint_stop` held while it waited for the node: a deadlock that killed the tunnel's ack batch.
    """
    signals.command_reports_locking.send(sender=Command, command_ids=sorted(ids))
    with connection.cursor() as cursor:
        sql = _NODES_KEY_SHARE.format(nodes=Node._meta.db_table, commands=Command._meta.db_table)
        cursor.execute(sql, [sorted(ids)])


def _audit_follow(moves: list[tuple[CommandReport, Command]]) -> None:
    """Settle the audit entries of the operator actions whose commands just finished: per entry, one
    look at the partial index of its open commands and one UPDATE; nothing for commands no action sent."""
    finished = [(r, c) for r, c in moves if c.audit_entry_id and r.to != CommandStatus.RUNNING]
    if not finished:
        return
    entries = {c.audit_entry_id for _, c in finished}
    open_ = {
        entry_id
        for entry_id in entries
        if Command.objects.filter(audit_entry_id=entry_id, status__in=COMMAND_OPEN_STATUSES).exists()
    }
    for entry_id in entries:
        mine = [c for _, c in finished if c.audit_entry_id == entry_id]
        failure = next(
            (
                f"{c.command_type} failed: {c.error_code}: {c.error_message}"
                for c in mine
                if c.status == CommandStatus.FAILED
            ),
            "",
        )
        commit = next(
            (str(c.result["commit"]) for c in mine if isinstance(c.result, dict) and c.result.get("commit")), ""
        )
        entry_settle(entry_id=entry_id, failure=failure, done=entry_id not in open_, git_commit=commit)


def _record_one(report: CommandReport) -> Command | None:
    outcome = command_record_reports(reports=[report])[0]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome

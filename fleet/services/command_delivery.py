"""Command delivery: claim a queued command (or a fan-out batch) and send it to its node's tunnel, send
again what got stuck, and hand the pending ones to a reconnecting node."""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid

from django.conf import settings
from django.db import models, transaction
from django.db.models import F
from django.utils import timezone

from fleet import groups
from fleet.models import Command, CommandStatus, Node, NodeEvent
from fleet.services.command_records import CommandReport, command_record_reports
from fleet.services.commands import command_transition
from fleet.services.events import node_event_record

logger = logging.getLogger(__name__)


def command_claim_and_send(*, command_id: uuid.UUID | str) -> bool:
    """Claim a queued command (queued → dispatched) and send it to its node's tunnel.

    Returns False and does nothing when the row is gone, already claimed, or its node is not
    connected (then it stays queued and `command_pending_for_node` delivers it on reconnect). A
    command claimed more than COMMAND_RESEND_AFTER_S ago and still unacknowledged is sent again (the
    task was redelivered after its worker died between claim and send; the agent deduplicates). If
    the send fails the claim is undone and the error re-raised for the task to retry.
    """
    row = Command.objects.filter(pk=command_id).values("node_id", "status", "node__connected").first()
    if row is None or row["status"] not in (CommandStatus.QUEUED, CommandStatus.DISPATCHED):
        return False
    if not row["node__connected"]:
        return False
    now = timezone.now()
    claimed = Command.objects.filter(pk=command_id, status=CommandStatus.QUEUED).update(
        status=CommandStatus.DISPATCHED, dispatched_at=now, attempts=F("attempts") + 1
    )
    if not claimed:
        # Redelivered after a crash between claim and send: claimed long ago, never acknowledged.
        stale = now - dt.timedelta(seconds=settings.COMMAND_RESEND_AFTER_S)
        claimed = Command.objects.filter(
            pk=command_id, status=CommandStatus.DISPATCHED, acked_at__isnull=True, dispatched_at__lt=stale
        ).update(dispatched_at=now, attempts=F("attempts") + 1)
    if not claimed:
        return False
    try:
        groups.send_to_node(row["node_id"], groups.command_message(command_id))
    except Exception:
        Command.objects.filter(pk=command_id, status=CommandStatus.DISPATCHED).update(status=CommandStatus.QUEUED)
        raise
    NodeEvent.objects.create(
        node_id=row["node_id"], kind="command.dispatched", message="Command sent to the node", command_id=command_id
    )
    return True


_BATCH_CLAIM_SQL = """
UPDATE fleet_command AS c
   SET status = 'dispatched', dispatched_at = %(now)s, attempts = c.attempts + 1
  FROM fleet_node AS n
 WHERE c.node_id = n.id AND n.connected AND c.batch_id = %(batch)s
   AND (c.status = 'queued'
        OR (c.status = 'dispatched' AND c.acked_at IS NULL AND c.dispatched_at < %(stale)s))
RETURNING c.id, c.node_id, c.command_type, c.idempotency_key, c.payload, c.secrets, n.tunnel_inbox
"""


def command_batch_claim_and_send(*, batch_id: uuid.UUID | str) -> int:
    """Claim all sendable commands of a batch with one conditional UPDATE … RETURNING, then send each.

    Sendable: queued on a connected node, or (a redelivered task) claimed more than
    COMMAND_RESEND_AFTER_S ago and never acknowledged. Commands of disconnected nodes stay queued
    for `command_pending_for_node`. Commands whose send fails are un-claimed (back to queued) and
    the task is failed for a retry. Returns how many were sent.
    """
    from django.db import connection

    now = timezone.now()
    stale = now - dt.timedelta(seconds=settings.COMMAND_RESEND_AFTER_S)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_BATCH_CLAIM_SQL, {"now": now, "batch": str(batch_id), "stale": stale})
        claimed = cursor.fetchall()
    if not claimed:
        return 0
    by_inbox: dict[str, list[int]] = {}
    messages = []
    for i, (pk, node_id, command_type, key, payload, secret, inbox) in enumerate(claimed):
        # The frame travels with the message (no read per node in the consumer) unless it has secrets.
        frame = None
        if not secret:
            payload = json.loads(payload) if isinstance(payload, str) else payload
            row = Command(pk=pk, idempotency_key=key, command_type=command_type, payload=payload)
            frame = groups.command_frame(row)
        messages.append((node_id, groups.command_message(pk, frame)))
        by_inbox.setdefault(inbox or "", []).append(i)
    claimed = [(pk, node_id) for pk, node_id, *_ in claimed]
    # One message per control-plane process holding tunnels; nodes with no known process, one each.
    sent = [False] * len(claimed)
    direct = by_inbox.pop("", [])
    for i, ok in zip(direct, groups.send_to_nodes([messages[i] for i in direct]), strict=True):
        sent[i] = ok
    for inbox, indexes in by_inbox.items():
        ok = groups.send_to_inbox(inbox, [messages[i] for i in indexes])
        for i in indexes:
            sent[i] = ok
    failed = [pk for (pk, _), ok in zip(claimed, sent, strict=True) if not ok]
    if failed:
        Command.objects.filter(pk__in=failed, status=CommandStatus.DISPATCHED).update(status=CommandStatus.QUEUED)
    NodeEvent.objects.bulk_create(
        [
            NodeEvent(node_id=node_id, kind="command.dispatched", message="Command sent to the node", command_id=pk)
            for (pk, node_id), ok in zip(claimed, sent, strict=True)
            if ok
        ]
    )
    if failed:
        raise ConnectionError(f"{len(failed)} of {len(claimed)} commands of batch {batch_id} could not be sent")
    return len(claimed)


def commands_resend_stuck(*, limit: int = 500) -> int:
    """Beat: send again what should have reached a connected node by now; returns how many were sent.

    Catches dispatch tasks lost with the broker (enqueued while Redis was down) and sends lost with a
    process: commands still queued COMMAND_RESEND_AFTER_S after creation, or claimed that long ago
    and never acknowledged, on nodes whose tunnel is up. Each goes through `command_claim_and_send`
    (the agent deduplicates by idempotency key); a failing send stops this pass for the next one.
    A command that was sent COMMAND_MAX_ATTEMPTS times and still never acknowledged is not sent again:
    it fails with the code `undelivered` and a message saying so (the Commands tab shows both), so no
    command waits forever on a node that looks connected.
    """
    stale = timezone.now() - dt.timedelta(seconds=settings.COMMAND_RESEND_AFTER_S)
    stuck = (
        Command.objects.filter(node__connected=True)
        .filter(
            models.Q(status=CommandStatus.QUEUED, created_at__lt=stale)
            | models.Q(status=CommandStatus.DISPATCHED, acked_at__isnull=True, dispatched_at__lt=stale)
        )
        .order_by("created_at")
        .values_list("pk", "node_id", "attempts")[:limit]
    )
    rows = list(stuck)
    given_up = [(pk, node_id, attempts) for pk, node_id, attempts in rows if attempts >= settings.COMMAND_MAX_ATTEMPTS]
    if given_up:
        _fail_undelivered(given_up)
    sent = 0
    for command_id, _, attempts in rows:
        if attempts >= settings.COMMAND_MAX_ATTEMPTS:
            continue
        try:
            sent += command_claim_and_send(command_id=command_id)
        except Exception:  # the channel layer is still away: the next pass tries again
            logger.warning("re-sending stuck command %s failed; retrying on the next pass", command_id)
            break
    return sent


def _fail_undelivered(rows: list[tuple[uuid.UUID, uuid.UUID, int]]) -> None:
    """Fail commands their connected node never acknowledged, however often they were sent."""
    waited = settings.COMMAND_RESEND_AFTER_S
    reports = [
        CommandReport.error(
            node_id,
            pk,
            code="undelivered",
            message=(
                f"The node never acknowledged this command: sent {attempts} times, the last more than {waited} s "
                "ago, while its tunnel looked connected. Not sent again; check the node's agent and retry."
            ),
        )
        for pk, node_id, attempts in rows
    ]
    with transaction.atomic():
        # An ack that arrived meanwhile wins: only rows still unacknowledged are failed.
        still = set(
            Command.objects.select_for_update()
            .filter(
                pk__in=[pk for pk, _, _ in rows],
                status__in=[CommandStatus.QUEUED, CommandStatus.DISPATCHED],
                acked_at__isnull=True,
            )
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        outcomes = command_record_reports(reports=[r for r in reports if r.command_id in still])
    for outcome in outcomes:
        if isinstance(outcome, Command):
            logger.warning("command %s failed as undelivered after %s sends", outcome.pk, outcome.attempts)


def command_pending_for_node(*, node: Node) -> list[Command]:
    """Unfinished commands of `node` (queued, dispatched or running), oldest first: sent on reconnect.

    Running ones too: their outcome may have been lost with the old socket. The agent deduplicates by
    idempotency key: one still running is only re-acknowledged, one already done re-sends its outcome.
    """
    return list(
        Command.objects.filter(
            node=node, status__in=[CommandStatus.QUEUED, CommandStatus.DISPATCHED, CommandStatus.RUNNING]
        ).order_by("created_at", "pk")
    )


def command_record_delivered(*, node: Node, command_id: uuid.UUID | str) -> Command | None:
    """The consumer sent a queued command itself (on reconnect): queued → dispatched."""
    with transaction.atomic():
        command = command_transition(
            command_id=command_id, node_id=node.pk, to=CommandStatus.DISPATCHED, attempts=F("attempts") + 1
        )
        if command:
            node_event_record(
                node_id=node.pk,
                kind="command.dispatched",
                message="Command sent to the node on reconnect",
                command=command,
            )
    return command

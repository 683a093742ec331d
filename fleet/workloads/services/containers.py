"""Containers on nodes: reconciled from inventories, and following their commands' outcomes."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from agent import protocol
from fleet.models import Command, CommandStatus, CommandType, Node, NodeEvent
from fleet.services import node_event_record
from fleet.workloads.models import Container, ContainerStatus
from fleet.workloads.quotas import container_ask, container_requests
from fleet.workloads.services.common import node_event_record_failure
from tenancy.quotas import admit


def _active_count(node_id: Any) -> int:
    return Container.objects.filter(node_id=node_id, status__in=ContainerStatus.active()).count()


def containers_reconcile(*, node: Node, inventory: protocol.Inventory) -> dict[str, int]:
    """Bring the node's Container rows in line with the agent's inventory; idempotent.

    Reported containers are matched to rows by container id, then by the create command's key, then
    by name (rows not yet holding an id); unmatched ones are adopted as new rows. Rows the agent no
    longer reports become `missing` (pending creates are left alone: the agent has not run them yet).
    A constant number of queries whatever the container count. Updates `node.containers_count`
    (containers in an active state). Returns counts of created/updated/missing rows.
    """
    with transaction.atomic():
        rows = list(Container.objects.select_for_update().filter(node=node).order_by("created_at", "pk"))
        by_id = {r.container_id: r for r in rows if r.container_id}
        by_key = {r.command_key: r for r in rows if r.command_key}
        by_name = {r.name: r for r in rows if not r.container_id}
        seen: set[uuid.UUID] = set()
        to_create: list[Container] = []
        to_update: list[Container] = []
        events: list[NodeEvent] = []
        for info in inventory.containers:
            status = info.status if info.status in ContainerStatus.reported() else ContainerStatus.RUNNING
            row = by_id.get(info.container_id) or (by_key.get(info.command_key) if info.command_key else None)
            if row is None or row.pk in seen:
                row = by_name.get(info.name)
                if row is not None and row.pk in seen:
                    row = None
            if row is None:
                row = Container(
                    node=node,
                    cluster_id=node.cluster_id,
                    container_id=info.container_id[:128],
                    name=info.name[:128],
                    image=info.image[:500],
                    status=status,
                    spec={"image": info.image, "name": info.name},
                    command_key=info.command_key[:64],
                )
                to_create.append(row)
                events.append(
                    NodeEvent(node_id=node.pk, kind="container.discovered", message=f"Container {info.name} found")
                )
                continue
            seen.add(row.pk)
            # A stop we sent is in flight: the agent may still report the container running.
            if row.status == ContainerStatus.STOPPING and status == ContainerStatus.RUNNING:
                status = ContainerStatus.STOPPING
            new = {
                "container_id": info.container_id[:128] or row.container_id,
                "name": info.name[:128],
                "image": info.image[:500] or row.image,
                "status": status,
            }
            if info.command_key and not row.command_key:
                new["command_key"] = info.command_key[:64]
            if any(getattr(row, k) != v for k, v in new.items()):
                if row.status != status:
                    events.append(
                        NodeEvent(
                            node_id=node.pk,
                            kind="container.status",
                            message=f"Container {row.name}: {row.status} → {status}",
                        )
                    )
                for k, v in new.items():
                    setattr(row, k, v)
                to_update.append(row)
        gone = [
            r.pk
            for r in rows
            if r.pk not in seen
            and r.status
            in (ContainerStatus.CREATED, ContainerStatus.RUNNING, ContainerStatus.STOPPING, ContainerStatus.EXITED)
        ]
        now = timezone.now()
        if to_create:
            Container.objects.bulk_create(to_create)
        if to_update:
            for row in to_update:
                row.updated_at = now
            Container.objects.bulk_update(
                to_update, ["container_id", "name", "image", "status", "command_key", "updated_at"]
            )
        if gone:
            Container.objects.filter(pk__in=gone).update(status=ContainerStatus.MISSING, updated_at=now)
            events.append(
                NodeEvent(
                    node_id=node.pk,
                    kind="container.missing",
                    message=f"{len(gone)} container(s) no longer reported by the agent: marked missing",
                    data={"containers": [str(pk) for pk in gone]},
                )
            )
        if events:
            NodeEvent.objects.bulk_create(events)
        count = _active_count(node.pk)
        Node.objects.filter(pk=node.pk).update(containers_count=count)
        node.containers_count = count
    return {"created": len(to_create), "updated": len(to_update), "missing": len(gone)}


def containers_record_queued(*, commands: list[Command]) -> list[Container]:
    """container.create queued (by an operator, the API or a drain), inside the queueing transaction:
    admitted against the workspace's quotas (`QuotaExceeded`, a 409, rolls the queueing back), then each
    command gets its `pending` Container row, so the next admission counts it."""
    first = commands[0]
    admit(workspace_id=first.cluster.workspace_id, ask=container_ask(first.parsed_payload, len(commands)))
    return Container.objects.bulk_create([_queued_row(c) for c in commands])


def _queued_row(command: Command) -> Container:
    """The `pending` row of a queued container.create."""
    payload: protocol.ContainerCreatePayload | None = command.parsed_payload
    return Container(
        node_id=command.node_id,
        cluster_id=command.cluster_id,
        name=payload.name[:128] if payload else "",
        image=payload.image[:500] if payload else "",
        status=ContainerStatus.PENDING,
        spec=command.payload or {},
        command_key=command.idempotency_key,
        created_by_command=command,
        **container_requests(payload),
    )


def containers_record_start_queued(*, commands: list[Command]) -> list[Container]:
    """container.start queued, inside the queueing transaction: each container that does not occupy its node
    (created, exited, stopped) is admitted against the workspace's quotas again with what its create asked
    (`QuotaExceeded` rolls the queueing back) and counts from now on (`pending` until the start's outcome),
    so concurrent starts cannot pass a limit together. Returns the rows admitted."""
    rows = [
        row
        for row in (_container_for_ref(c) for c in commands)
        if row is not None and row.status not in ContainerStatus.active()
    ]
    if not rows:
        return []
    ask: dict[str, float] = {}
    for row in rows:
        for name, amount in container_ask(row.parsed_spec).items():
            ask[name] = ask.get(name, 0) + amount
    admit(workspace_id=commands[0].cluster.workspace_id, ask=ask)
    for row in rows:
        row.status = ContainerStatus.PENDING
        row.save(update_fields=["status", "updated_at"])
    for node_id in {row.node_id for row in rows}:
        Node.objects.filter(pk=node_id).update(containers_count=_active_count(node_id))
    return rows


def container_record_created(*, command: Command) -> Container | None:
    """A container.create succeeded: the row (created at dispatch, or now) gets the agent's container id."""
    if command.command_type != CommandType.CONTAINER_CREATE or command.status != CommandStatus.SUCCEEDED:
        return None
    result: protocol.ContainerResult = command.parsed_result
    container_id = result.container_id[:128]
    payload: protocol.ContainerCreatePayload | None = command.parsed_payload
    reported = result.status
    if reported in ContainerStatus.reported():
        status = reported
    else:
        status = ContainerStatus.RUNNING if payload is None or payload.start else ContainerStatus.CREATED
    with transaction.atomic():
        row = (
            Container.objects.select_for_update()
            .filter(Q(created_by_command=command) | Q(node_id=command.node_id, command_key=command.idempotency_key))
            .first()
        )
        if row is None and container_id:
            row = (
                Container.objects.select_for_update().filter(node_id=command.node_id, container_id=container_id).first()
            )
        if row is None:
            row = Container(node_id=command.node_id, cluster_id=command.cluster_id)
        row.container_id = container_id or row.container_id
        if payload is not None:
            row.name, row.image = payload.name[:128], payload.image[:500]
            for name, value in container_requests(payload).items():
                setattr(row, name, value)
        row.spec = command.payload or {}
        row.command_key = command.idempotency_key
        row.created_by_command = command
        row.status = status
        row.error_code = row.error_message = ""
        row.save()
        node_event_record(
            node_id=command.node_id,
            kind="container.created",
            message=f"Container {row.name} is {status}",
            command=command,
        )
        count = _active_count(command.node_id)
        Node.objects.filter(pk=command.node_id).update(containers_count=count)
    return row


def container_record_create_failed(*, command: Command) -> Container | None:
    """A container.create failed: its row (if any) becomes `failed` with the agent's code and message."""
    with transaction.atomic():
        row = Container.objects.select_for_update().filter(created_by_command=command).first()
        if row is not None:
            row.status = ContainerStatus.FAILED
            row.error_code = command.error_code
            row.error_message = command.error_message
            row.save(update_fields=["status", "error_code", "error_message", "updated_at"])
        payload: protocol.ContainerCreatePayload | None = command.parsed_payload
        name = payload.name if payload is not None else "?"
        node_event_record_failure(
            command=command, kind="container.failed", what=f"Container {name} could not be created"
        )
        Node.objects.filter(pk=command.node_id).update(containers_count=_active_count(command.node_id))
    return row


def _container_for_ref(command: Command) -> Container | None:
    payload: protocol.ContainerRefPayload | None = command.parsed_payload
    ref = payload.container if payload is not None else ""
    if not ref:
        return None
    rows = Container.objects.select_for_update().filter(node_id=command.node_id)
    return (
        rows.filter(stop_command=command).first()
        or rows.filter(container_id=ref).first()
        or rows.filter(name=ref).exclude(status=ContainerStatus.REMOVED).order_by("-created_at").first()
    )


REF_OUTCOME = {
    CommandType.CONTAINER_START: ContainerStatus.RUNNING,
    CommandType.CONTAINER_STOP: ContainerStatus.STOPPED,
    CommandType.CONTAINER_DESTROY: ContainerStatus.REMOVED,
}


def container_record_ref_outcome(*, command: Command) -> Container | None:
    """A container.start/stop/destroy finished: update the row; `not_found` on stop/destroy means gone."""
    with transaction.atomic():
        row = _container_for_ref(command)
        if row is None:
            return None
        gone_anyway = command.status == CommandStatus.FAILED and command.error_code == "not_found"
        if command.status == CommandStatus.SUCCEEDED or (
            gone_anyway and command.command_type != CommandType.CONTAINER_START
        ):
            status = REF_OUTCOME[command.command_type]
            if gone_anyway:
                status = ContainerStatus.MISSING
            row.status = status
            row.error_code = row.error_message = ""
            node_event_record(
                node_id=command.node_id,
                kind="container.status",
                message=f"Container {row.name} is {status}",
                command=command,
            )
        else:
            if row.stop_command_id == command.pk:
                row.stop_command = None  # the drain will try again
            if row.status == ContainerStatus.STOPPING:
                row.status = ContainerStatus.RUNNING
            elif command.command_type == CommandType.CONTAINER_START and row.status == ContainerStatus.PENDING:
                row.status = ContainerStatus.EXITED  # not started: it frees its quota (the inventory corrects it)
            row.error_code = command.error_code
            row.error_message = command.error_message
            node_event_record_failure(
                command=command, kind="container.failed", what=f"{command.command_type} of {row.name} failed"
            )
        row.save()
        Node.objects.filter(pk=command.node_id).update(containers_count=_active_count(command.node_id))
    return row

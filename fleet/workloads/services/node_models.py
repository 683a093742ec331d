"""Models cached on nodes: reconciled from inventories, and recorded when a model.download finishes."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from agent import protocol
from fleet.models import Command, Node
from fleet.services import node_event_record
from fleet.workloads.models import NodeModel
from fleet.workloads.services.common import MAX_MODEL_ID, MAX_REVISION, node_event_record_failure


def node_models_reconcile(*, node: Node, inventory: protocol.Inventory) -> dict[str, int]:
    """Make the node's NodeModel rows exactly the inventory's cached models; constant queries; idempotent."""
    reported: dict[tuple[str, str], protocol.CachedModel] = {}
    for m in inventory.models:
        if m.model_id and len(m.model_id) <= MAX_MODEL_ID and len(m.revision or "main") <= MAX_REVISION:
            reported[(m.model_id, m.revision or "main")] = m
    with transaction.atomic():
        rows = {(r.model_id, r.revision): r for r in NodeModel.objects.select_for_update().filter(node=node)}
        now = timezone.now()
        new = [
            NodeModel(
                node=node,
                model_id=key[0],
                revision=key[1],
                path=m.path[:1000],
                size_bytes=max(m.size_bytes, 0),
            )
            for key, m in reported.items()
            if key not in rows
        ]
        changed = []
        for key, row in rows.items():
            m = reported.get(key)
            if m is not None and (row.path != m.path[:1000] or row.size_bytes != max(m.size_bytes, 0)):
                row.path, row.size_bytes, row.updated_at = m.path[:1000], max(m.size_bytes, 0), now
                changed.append(row)
        gone = [row.pk for key, row in rows.items() if key not in reported]
        if new:
            NodeModel.objects.bulk_create(new)
        if changed:
            NodeModel.objects.bulk_update(changed, ["path", "size_bytes", "updated_at"])
        if gone:
            NodeModel.objects.filter(pk__in=gone).delete()
        if new or gone:
            added = ", ".join(f"{m.model_id}@{m.revision}" for m in new[:10])
            node_event_record(
                node_id=node.pk,
                kind="models.changed",
                message=f"Model cache: {len(new)} added{f' ({added})' if added else ''}, {len(gone)} removed",
            )
    return {"created": len(new), "updated": len(changed), "removed": len(gone)}


def node_model_record_downloaded(*, command: Command) -> NodeModel | None:
    """A model.download succeeded: record the snapshot at once (the next inventory confirms it).

    Uses the result's `path` (required) and `size_bytes` / `revision` when the agent sends them.
    """
    payload: protocol.ModelDownloadPayload | None = command.parsed_payload
    result: protocol.ModelDownloadResult | None = command.parsed_result
    if payload is None or result is None or not result.path:
        return None
    model_id, path = payload.model_id, result.path
    revision = result.revision or payload.revision
    size = max(result.size_bytes, 0)
    row, _ = NodeModel.objects.update_or_create(
        node_id=command.node_id,
        model_id=model_id[:MAX_MODEL_ID],
        revision=revision[:MAX_REVISION],
        defaults={"path": path[:1000], "size_bytes": size},
    )
    node_event_record(
        node_id=command.node_id,
        kind="model.downloaded",
        message=f"Model {model_id}@{revision} is in the cache",
        command=command,
    )
    return row


def node_model_record_download_failed(*, command: Command) -> None:
    """A model.download failed: say why, with the fix, in the node's event log."""
    payload: protocol.ModelDownloadPayload | None = command.parsed_payload
    model = payload.model_id if payload is not None else "?"
    node_event_record_failure(command=command, kind="model.failed", what=f"Download of {model} failed")

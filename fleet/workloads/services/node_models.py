"""Models cached on nodes: reconciled from inventories, recorded when a model.download or model.evict finishes;
eviction on request (refused while an endpoint serves from the snapshot) and the node's cache budget."""

from __future__ import annotations

import datetime as dt

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from agent import protocol
from fleet.models import Command, Node
from fleet.services import command_dispatch, node_event_record
from fleet.workloads.models import EndpointReplica, EndpointStatus, NodeCache, NodeModel
from fleet.workloads.services.common import MAX_MODEL_ID, MAX_REVISION, node_event_record_failure
from kernel.exceptions import IllegalTransition
from tenancy.mixins import require_operator

MAX_BUDGET_MB = 2**40  # 1 EiB: no budget is larger


def _seen(at: float) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(at, tz=dt.UTC) if at > 0 else None


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
                last_used_at=_seen(m.last_used_at),
            )
            for key, m in reported.items()
            if key not in rows
        ]
        changed = []
        for key, row in rows.items():
            m = reported.get(key)
            if m is not None and (
                row.path != m.path[:1000]
                or row.size_bytes != max(m.size_bytes, 0)
                or row.last_used_at != _seen(m.last_used_at)
            ):
                row.path, row.size_bytes, row.updated_at = m.path[:1000], max(m.size_bytes, 0), now
                row.last_used_at = _seen(m.last_used_at)
                changed.append(row)
        gone = [row.pk for key, row in rows.items() if key not in reported]
        if new:
            NodeModel.objects.bulk_create(new)
        if changed:
            NodeModel.objects.bulk_update(changed, ["path", "size_bytes", "updated_at", "last_used_at"])
        if inventory.disk_free_bytes or inventory.cache_budget_bytes:  # an agent of protocol 7 on
            NodeCache.objects.update_or_create(
                node=node,
                defaults={
                    "disk_free_bytes": max(inventory.disk_free_bytes, 0),
                    "reported_budget_bytes": max(inventory.cache_budget_bytes, 0),
                    "reported_at": now,
                },
            )
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
        defaults={"path": path[:1000], "size_bytes": size, "last_used_at": command.finished_at or timezone.now()},
    )
    evicted = [ref for ref in result.evicted or [] if "@" in ref][:100]
    for ref in evicted:
        evicted_id, _, evicted_revision = ref.rpartition("@")
        NodeModel.objects.filter(node_id=command.node_id, model_id=evicted_id, revision=evicted_revision).delete()
    note = f"; the cache budget evicted {', '.join(evicted)} (least recently used)" if evicted else ""
    node_event_record(
        node_id=command.node_id,
        kind="model.downloaded",
        message=f"Model {model_id}@{revision} is in the cache{note}",
        command=command,
    )
    return row


def node_model_record_download_failed(*, command: Command) -> None:
    """A model.download failed: say why, with the fix, in the node's event log."""
    payload: protocol.ModelDownloadPayload | None = command.parsed_payload
    model = payload.model_id if payload is not None else "?"
    node_event_record_failure(command=command, kind="model.failed", what=f"Download of {model} failed")


# ---- eviction and the budget


def _serving(*, node_id: object, model_id: str, revision: str) -> list[str]:
    """Endpoint slugs whose live replicas on the node serve this snapshot."""
    return list(
        EndpointReplica.objects.filter(
            node_id=node_id,
            status__in=EndpointStatus.live(),
            endpoint__model_id=model_id,
            endpoint__revision=revision,
        )
        .values_list("endpoint__slug", flat=True)
        .distinct()
    )


def node_model_evict(*, actor: AbstractBaseUser, cached: NodeModel) -> Command:
    """Remove a snapshot from its node's cache (Owner/Admin): a model.evict command; IllegalTransition (409)
    while an endpoint's replica on that node serves from it (the agent refuses too)."""
    node = cached.node
    require_operator(actor, node.cluster.workspace, what="evict models from a node's cache")
    serving = _serving(node_id=node.pk, model_id=cached.model_id, revision=cached.revision)
    if serving:
        raise IllegalTransition(
            f"{cached.model_id}@{cached.revision} is in use on node {node.name} by endpoint(s) "
            f"{', '.join(serving)}; stop them first."
        )
    (command,) = command_dispatch(
        actor=actor,
        cluster=node.cluster,
        command_type="model.evict",
        payload={"model_id": cached.model_id, "revision": cached.revision},
        node=node,
    )
    return command


def node_models_record_queued(*, commands: list[Command]) -> None:
    """Inside the queueing transaction: a model.evict of a snapshot an endpoint serves from is refused (400,
    whichever API sent it); a model.download carries its node's cache budget (agents of protocol 7 on)."""
    for command in commands:
        payload = command.payload or {}
        if command.command_type == "model.evict":
            serving = _serving(
                node_id=command.node_id, model_id=payload.get("model_id", ""), revision=payload.get("revision", "main")
            )
            if serving:
                raise ValidationError({"model_id": f"In use by endpoint(s) {', '.join(serving)} on this node."})
        elif command.command_type == "model.download":
            # the control plane's to set (the payload's default 0 is filled in): the node's budget, and only for
            # agents that know the field (an older one refuses a payload with a field it does not know); an
            # empty `local_path` is left out for the same reason
            budget = NodeCache.objects.filter(node_id=command.node_id).values_list("budget_mb", flat=True).first()
            node = Node.objects.only("protocol_version").get(pk=command.node_id)
            sent = {k: v for k, v in payload.items() if k != "cache_budget_bytes" and (k != "local_path" or v)}
            if budget and node.protocol_version >= protocol.MODEL_CACHE_SINCE:
                sent["cache_budget_bytes"] = budget * 1024 * 1024
            if sent != payload:
                command.payload = sent
                Command.objects.filter(pk=command.pk).update(payload=sent)


def node_model_record_evicted(*, command: Command) -> None:
    """A model.evict finished: the row goes (succeeded) or the node's log says why not (failed)."""
    payload: protocol.ModelEvictPayload | None = command.parsed_payload
    if payload is None:
        return
    label = f"{payload.model_id}@{payload.revision}"
    if command.status != "succeeded":
        node_event_record_failure(command=command, kind="model.failed", what=f"Eviction of {label} failed")
        return
    NodeModel.objects.filter(node_id=command.node_id, model_id=payload.model_id, revision=payload.revision).delete()
    result: protocol.ModelEvictResult | None = command.parsed_result
    freed = result.freed_bytes if result is not None else 0
    node_event_record(
        node_id=command.node_id,
        kind="model.evicted",
        message=f"Model {label} left the cache ({freed // (1024 * 1024)} MiB freed)",
        command=command,
    )


def node_cache_set_budget(*, actor: AbstractBaseUser, node: Node, budget_mb: int) -> NodeCache:
    """Set the node's model cache budget (Owner/Admin; 0: none): sent with each model.download to it, after
    which the agent evicts the least recently used snapshots no endpoint serves from."""
    require_operator(actor, node.cluster.workspace, what="set a node's cache budget")
    if isinstance(budget_mb, bool) or not isinstance(budget_mb, int) or not 0 <= budget_mb <= MAX_BUDGET_MB:
        raise ValidationError({"budget_mb": f"A whole number of MiB from 0 (no budget) to {MAX_BUDGET_MB}."})
    cache, _ = NodeCache.objects.update_or_create(node=node, defaults={"budget_mb": budget_mb})
    node_event_record(
        node_id=node.pk,
        kind="models.budget",
        message=f"Model cache budget set to {budget_mb} MiB" if budget_mb else "Model cache budget removed",
    )
    return cache

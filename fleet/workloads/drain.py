"""The real drain: move every running container off a draining node, then cordon it.

`drain_step` is one idempotent pass, run by the beat task `drain_tick`, by `drain_node_now`, and by
the command-finished / inventory hooks. Per running container on the draining node it walks:

1. no live replacement → choose the least loaded online, connected node of the cluster that fits
   the container's spec (memory, cpu, GPUs) and dispatch `container.create` of the same spec there,
   named `<name>-r<n>` (names must not clash in kubernetes/argocd mode, where all nodes share a
   namespace) and labelled `cleverthis.replacement-of`; the new row links `replacement_of`.
2. replacement pending → wait.
3. replacement running → dispatch a graceful `container.stop` for the original (→ `stopping`).
4. original stopped (hook) → done with it.

Endpoint replicas on the node move by the endpoints' healing pass (`services.endpoints.heal`: replaced,
then stopped once the replacement runs); the drain waits for them.

No fitting node: the container stays where it is, the node stays draining, a `drain.no_fit` event is
written once per container per drain (per reason), and the step's `DrainReport` lists it. When no
container is running or stopping on the node any more, draining → cordoned.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Q

from agent import protocol
from fleet import payloads, services
from fleet.models import Command, CommandStatus, CommandType, Node, NodeEvent, NodeStatus
from fleet.workloads.errors import error_sentence
from fleet.workloads.models import Container, ContainerStatus, EndpointReplica, EndpointStatus
from fleet.workloads.services import system_actor
from kernel.exceptions import IllegalTransition
from tenancy.quotas import try_lock_quota

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30
MAX_REPLACEMENT_ATTEMPTS = 3
MAX_STOP_ATTEMPTS = 3
REPLACEMENT_LABEL = "cleverthis.replacement-of"
# The Celery task taking one drain pass for a node (`fleet.workloads.tasks.drain_node`): its wire name, kept
# from when it lived in `fleet.tasks`. The core asks for a pass with `fleet.signals.drain_requested`.
DRAIN_TASK = "fleet.tasks.drain_node"
_SUFFIX = re.compile(r"-r\d+$")
# Replacement states that still count as the one taking over (running, or on its way there).
_LIVE = frozenset({ContainerStatus.PENDING, ContainerStatus.CREATED, ContainerStatus.RUNNING})


@dataclass
class DrainReport:
    """What one drain pass saw and did (lists of `{"container", "name", ...}` dicts)."""

    node_id: str
    status: str
    finished: bool = False
    replacing: list[dict[str, Any]] = field(default_factory=list)  # replacement dispatched in this pass
    waiting: list[dict[str, Any]] = field(default_factory=list)  # replacement not running yet
    stopping: list[dict[str, Any]] = field(default_factory=list)  # original's graceful stop in flight
    blocked: list[dict[str, Any]] = field(default_factory=list)  # stays: no node fits, or gave up
    remaining: int = 0


@dataclass
class _Target:
    node: Node
    count: int = 0
    gpus_used: int = 0
    pending_memory_mb: int = 0

    def free_memory_mb(self) -> int:
        return self.node.memory_total_mb - self.node.memory_used_mb - self.pending_memory_mb

    def fits(self, need: dict[str, Any]) -> bool:
        return (
            self.free_memory_mb() >= need["memory_mb"]
            and self.node.cpu_count >= need["cpu"]
            and self.node.gpu_count - self.gpus_used >= need["gpus"]
        )


def _needs(spec: Any) -> dict[str, Any]:
    """What a container's create payload (`Container.spec`) asks of a node; nothing for an adopted one."""
    payload: protocol.ContainerCreatePayload | None = protocol.read_payload("container.create", spec)
    if payload is None:
        return {"memory_mb": 0, "cpu": 0, "gpus": 0}
    return {"memory_mb": payload.memory_mb, "cpu": payload.cpu, "gpus": payload.gpus}


def _needs_text(need: dict[str, Any]) -> str:
    return f"memory {need['memory_mb']} MB, cpu {need['cpu']:g}, gpus {need['gpus']}"


def _targets(node: Node) -> list[_Target]:
    nodes = list(
        Node.objects.filter(cluster_id=node.cluster_id, status=NodeStatus.ONLINE, connected=True)
        .exclude(pk=node.pk)
        .order_by("name", "pk")
    )
    targets = {n.pk: _Target(n) for n in nodes}
    for node_id, status, spec in Container.objects.filter(
        node_id__in=list(targets), status__in=ContainerStatus.active()
    ).values_list("node_id", "status", "spec"):
        t = targets[node_id]
        need = _needs(spec or {})
        t.count += 1
        t.gpus_used += need["gpus"]
        if status == ContainerStatus.PENDING:
            t.pending_memory_mb += need["memory_mb"]
    return list(targets.values())


def _choose(targets: list[_Target], need: dict[str, Any]) -> _Target | None:
    fitting = [t for t in targets if t.fits(need)]
    if not fitting:
        return None
    return min(fitting, key=lambda t: (t.count, -t.free_memory_mb(), t.node.name, str(t.node.pk)))


def _replacement_name(original: Container) -> str:
    base = _SUFFIX.sub("", original.name)[:120]
    taken = Container.objects.filter(cluster_id=original.cluster_id, name__regex=rf"^{re.escape(base)}-r[0-9]+$")
    numbers = [int(name.rsplit("-r", 1)[1]) for name in taken.values_list("name", flat=True)]
    return f"{base}-r{max(numbers, default=0) + 1}"


def _replacement_payload(original: Container, name: str) -> dict[str, Any] | None:
    """The original's create payload with its secrets (None: they went with its create command)."""
    command = original.created_by_command
    if command is None and payloads.has_masked_secrets(original.spec or {}):
        return None  # the spec only has masks: a replacement would run with "••••••" as its secrets
    payload = dict(command.submitted_payload() if command is not None else original.spec or {})
    payload.setdefault("image", original.image)
    payload["name"] = name
    payload["start"] = True  # the original runs, so must its replacement
    payload["labels"] = {**(payload.get("labels") or {}), REPLACEMENT_LABEL: str(original.pk)}
    return payload


def _ref(container: Container) -> str:
    return container.container_id or container.name


def _entry(container: Container, **extra: Any) -> dict[str, Any]:
    return {"container": str(container.pk), "name": container.name, **extra}


def _block(node: Node, original: Container, reason: str, report: DrainReport) -> None:
    """Report `original` as staying; write the event once per container, reason and drain."""
    report.blocked.append(_entry(original, reason=reason))
    already = NodeEvent.objects.filter(
        node=node,
        kind="drain.no_fit",
        created_at__gte=node.status_changed_at,
        data__container=str(original.pk),
        data__reason=reason,
    ).exists()
    if not already:
        services.node_event_record(
            node_id=node.pk,
            kind="drain.no_fit",
            message=f"Drain: {reason}; {original.name} stays on this node and the node stays draining",
            data={"container": str(original.pk), "reason": reason},
        )


def _finish(node: Node, report: DrainReport) -> None:
    Node.objects.filter(pk=node.pk).update(containers_count=0)
    node.containers_count = 0
    node = services.node_finish_drain(node=node)
    report.status = node.status
    report.finished = node.status == NodeStatus.CORDONED


def drain_step(*, node_id: uuid.UUID | str) -> DrainReport:
    """One idempotent pass of the drain of `node_id` (see the module docstring)."""
    with transaction.atomic():
        # The workspace's quota row first (the lock order of admissions), without waiting: an admission
        # holding it may wait for a node this pass's caller holds; the next pass does the work then.
        workspace_id = Node.objects.filter(pk=node_id).values_list("cluster__workspace_id", flat=True).first()
        if workspace_id is None:
            return DrainReport(node_id=str(node_id), status="gone")
        if not try_lock_quota(workspace_id):
            return DrainReport(node_id=str(node_id), status="busy")
        # skip_locked: another pass (tick, hook) holding this node is doing the work; never wait for it.
        # Waiting here from a hook that already locked a target node could deadlock with that pass.
        node = (
            Node.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("cluster__workspace")
            .filter(pk=node_id)
            .first()
        )
        if node is None:
            busy = Node.objects.filter(pk=node_id).exists()
            return DrainReport(node_id=str(node_id), status="busy" if busy else "gone")
        report = DrainReport(node_id=str(node.pk), status=node.status)
        if node.status != NodeStatus.DRAINING:
            return report
        originals = list(
            Container.objects.select_for_update(of=("self",))
            .select_related("created_by_command")
            .filter(node=node, status__in=[ContainerStatus.RUNNING, ContainerStatus.STOPPING])
            .order_by("created_at", "pk")
        )
        report.remaining = len(originals)
        if not originals:
            # endpoint replicas move by the endpoints' healing pass (`services.endpoints.heal`): wait for them
            replicas = EndpointReplica.objects.filter(node=node, status__in=EndpointStatus.live()).count()
            if replicas:
                report.remaining = replicas
                return report
            _finish(node, report)
            return report
        replacements: dict[uuid.UUID, list[Container]] = {}
        for rep in Container.objects.filter(replacement_of__in=originals).order_by("created_at", "pk"):
            replacements.setdefault(rep.replacement_of_id, []).append(rep)
        targets: list[_Target] | None = None
        try:
            actor = system_actor(node.cluster.workspace)
        except PermissionDenied as exc:
            for original in originals:
                _block(node, original, str(exc), report)
            return report
        for original in originals:
            reps = replacements.get(original.pk, [])
            live = next((r for r in reps if r.status in _LIVE), None)
            if original.status == ContainerStatus.STOPPING:
                report.stopping.append(_entry(original))
                continue
            if live is not None and live.status == ContainerStatus.RUNNING:
                failed_stops = Command.objects.filter(
                    node=node,
                    command_type=CommandType.CONTAINER_STOP,
                    status=CommandStatus.FAILED,
                    payload__container=_ref(original),
                ).count()
                if failed_stops >= MAX_STOP_ATTEMPTS:
                    _block(node, original, f"stopping {original.name} failed {failed_stops} times", report)
                    continue
                (stop,) = services.command_queue(
                    actor=actor,
                    cluster=node.cluster,
                    command_type=CommandType.CONTAINER_STOP,
                    payload=protocol.ContainerRefPayload(container=_ref(original), timeout_s=STOP_TIMEOUT_S),
                    node=node,
                )
                original.status = ContainerStatus.STOPPING
                original.stop_command = stop
                original.save(update_fields=["status", "stop_command", "updated_at"])
                services.node_event_record(
                    node_id=node.pk,
                    kind="drain.stopping",
                    message=f"Drain: replacement {live.name} runs on {live.node.name}; stopping {original.name} "
                    f"gracefully (timeout {STOP_TIMEOUT_S} s)",
                    data={"container": str(original.pk), "replacement": str(live.pk)},
                    command=stop,
                )
                report.stopping.append(_entry(original, replacement=str(live.pk)))
                continue
            if live is not None:
                report.waiting.append(_entry(original, replacement=str(live.pk), target=str(live.node_id)))
                continue
            failures = [r for r in reps if r.status not in _LIVE]  # failed, or died before taking over
            if len(failures) >= MAX_REPLACEMENT_ATTEMPTS:
                last = failures[-1]
                why = (
                    error_sentence(last.error_code, last.error_message)
                    if last.error_code
                    else f"{last.name} ended {last.status}"
                )
                reason = f"replacing {original.name} failed {len(failures)} times (last: {why})"
                _block(node, original, reason, report)
                continue
            if targets is None:
                targets = _targets(node)
            need = _needs(original.spec or {})
            target = _choose(targets, need)
            if target is None:
                _block(node, original, f"no node fits {original.name} (needs {_needs_text(need)})", report)
                continue
            name = _replacement_name(original)
            payload = _replacement_payload(original, name)
            if payload is None:
                reason = f"cannot replace {original.name}: its secret values went with its deleted create command"
                _block(node, original, reason, report)
                continue
            try:
                (create,) = services.command_queue(
                    actor=actor,
                    cluster=node.cluster,
                    command_type=CommandType.CONTAINER_CREATE,
                    payload=payload,
                    node=target.node,
                )
            except (ValidationError, IllegalTransition) as exc:
                text = "; ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)
                _block(node, original, f"cannot replace {original.name} on {target.node.name}: {text}", report)
                continue
            # the pending row the queueing made (after admitting it against the workspace's quotas)
            replacement = Container.objects.get(created_by_command=create)
            replacement.replacement_of = original
            replacement.save(update_fields=["replacement_of", "updated_at"])
            target.count += 1
            target.gpus_used += need["gpus"]
            target.pending_memory_mb += need["memory_mb"]
            message = f"Drain: starting replacement {name} for {original.name} on {target.node.name}"
            data = {"container": str(original.pk), "replacement": str(replacement.pk)}
            services.node_event_record(
                node_id=node.pk, kind="drain.replacing", message=message, data=data, command=create
            )
            services.node_event_record(
                node_id=target.node.pk,
                kind="drain.replacement",
                message=f"{message} (moved from {node.name})",
                data=data,
            )
            report.replacing.append(_entry(original, replacement=str(replacement.pk), target=str(target.node.pk)))
        Node.objects.filter(pk=node.pk).update(
            containers_count=Container.objects.filter(node=node, status__in=ContainerStatus.active()).count()
        )
    return report


def drain_step_for_related(*, node_ids: Iterable[Any]) -> list[DrainReport]:
    """Run `drain_step` for each draining node among `node_ids` and each draining node whose containers
    have replacements on `node_ids` (their progress may just have changed)."""
    ids = [i for i in node_ids if i]
    if not ids:
        return []
    draining = (
        Node.objects.filter(Q(pk__in=ids) | Q(containers__replacements__node_id__in=ids), status=NodeStatus.DRAINING)
        .values_list("pk", flat=True)
        .distinct()
    )
    return [drain_step(node_id=pk) for pk in sorted(draining, key=str)]

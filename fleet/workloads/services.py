"""Services and selectors for workloads: containers, models cached on nodes, inference endpoints.

Called by the tunnel consumer (inventory reconciliation) and by the command-finished hook
`workloads_on_command_finished`, which the fleet core calls after `command_record_result` /
`command_record_error` so every finished command updates the rows it concerns.
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from agent import protocol
from cleverthis.audit.services import created, new, on, operator_action
from cleverthis.tenancy.models import Membership, Role, Workspace
from cleverthis.tenancy.permissions import can_operate
from fleet.models import Command, CommandStatus, CommandType, ComputeCluster, Node, NodeEvent, NodeStatus
from fleet.payloads import MODEL_ID_RE
from fleet.workloads.errors import error_help, error_sentence
from fleet.workloads.models import Container, ContainerStatus, Endpoint, EndpointStatus, NodeModel
from kernel.exceptions import IllegalTransition

logger = logging.getLogger(__name__)

REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]*$")
MAX_MODEL_ID = 200
MAX_REVISION = 200

# --------------------------------------------------------------------------------------------------
# Shared helpers


def _event(node_id: Any, kind: str, message: str, *, data: dict | None = None, command: Command | None = None) -> None:
    NodeEvent.objects.create(node_id=node_id, kind=kind, message=message, data=data or {}, command=command)


def _failure_event(command: Command, kind: str, what: str) -> None:
    """`<what>: <why>. Fix: <fix>` in the node's event log, with the error's explanation as data."""
    _event(
        command.node_id,
        kind,
        f"{what}: {error_sentence(command.error_code, command.error_message)}",
        data={"error_help": error_help(command.error_code)},
        command=command,
    )


def system_actor(workspace: Workspace) -> AbstractBaseUser:
    """The user the control plane acts as for automatic commands (drain): the first Owner, else Admin."""
    membership = (
        Membership.objects.filter(workspace=workspace, role__in=[Role.OWNER, Role.ADMIN])
        .select_related("user")
        .order_by("-role", "created_at", "pk")  # "owner" sorts after "admin": descending puts owners first
        .first()
    )
    if membership is None:
        raise PermissionDenied("The workspace has no Owner or Admin to run automatic commands as.")
    return membership.user


def _require_operator(actor: Any, workspace: Workspace) -> None:
    if not can_operate(actor, workspace):
        raise PermissionDenied("Only workspace Owners and Admins can do this.")


def node_free_vram_mb(node: Node, gpus: int = 0) -> int:
    """Free VRAM: on the `gpus` GPUs with most free memory, or on all GPUs when `gpus` is 0."""
    per_gpu = sorted(
        (max(int(g.get("memory_total_mb", 0)) - int(g.get("memory_used_mb", 0)), 0) for g in node.gpus or []),
        reverse=True,
    )
    if not per_gpu:
        return max(node.vram_total_mb - node.vram_used_mb, 0)
    return sum(per_gpu[:gpus] if gpus > 0 else per_gpu)


# --------------------------------------------------------------------------------------------------
# Containers


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


def container_record_created(*, command: Command) -> Container | None:
    """A container.create succeeded: the row (created at dispatch, or now) gets the agent's container id."""
    if command.command_type != CommandType.CONTAINER_CREATE or command.status != CommandStatus.SUCCEEDED:
        return None
    data = command.result or {}
    container_id = str(data.get("container_id") or "")[:128]
    spec = command.payload or {}
    reported = data.get("status")
    if reported in ContainerStatus.reported():
        status = reported
    else:
        status = ContainerStatus.RUNNING if spec.get("start", True) else ContainerStatus.CREATED
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
        row.name = str(spec.get("name", row.name))[:128]
        row.image = str(spec.get("image", row.image))[:500]
        row.spec = spec
        row.command_key = command.idempotency_key
        row.created_by_command = command
        row.status = status
        row.error_code = row.error_message = ""
        row.save()
        _event(command.node_id, "container.created", f"Container {row.name} is {status}", command=command)
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
        name = (command.payload or {}).get("name", "?")
        _failure_event(command, "container.failed", f"Container {name} could not be created")
        Node.objects.filter(pk=command.node_id).update(containers_count=_active_count(command.node_id))
    return row


def _container_for_ref(command: Command) -> Container | None:
    ref = str((command.payload or {}).get("container", ""))
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
            _event(command.node_id, "container.status", f"Container {row.name} is {status}", command=command)
        else:
            if row.stop_command_id == command.pk:
                row.stop_command = None  # the drain will try again
            if row.status == ContainerStatus.STOPPING:
                row.status = ContainerStatus.RUNNING
            row.error_code = command.error_code
            row.error_message = command.error_message
            _failure_event(command, "container.failed", f"{command.command_type} of {row.name} failed")
        row.save()
        Node.objects.filter(pk=command.node_id).update(containers_count=_active_count(command.node_id))
    return row


# --------------------------------------------------------------------------------------------------
# Models cached on nodes


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
            _event(
                node.pk,
                "models.changed",
                f"Model cache: {len(new)} added{f' ({added})' if added else ''}, {len(gone)} removed",
            )
    return {"created": len(new), "updated": len(changed), "removed": len(gone)}


def node_model_record_downloaded(*, command: Command) -> NodeModel | None:
    """A model.download succeeded: record the snapshot at once (the next inventory confirms it).

    Uses the result's `path` (required) and `size_bytes` / `revision` when the agent sends them.
    """
    payload, data = command.payload or {}, command.result or {}
    model_id, path = payload.get("model_id"), data.get("path")
    revision = data.get("revision") or payload.get("revision") or "main"
    if not isinstance(model_id, str) or not isinstance(path, str) or not path or not isinstance(revision, str):
        return None
    size = data.get("size_bytes", 0)
    size = size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 0
    row, _ = NodeModel.objects.update_or_create(
        node_id=command.node_id,
        model_id=model_id[:MAX_MODEL_ID],
        revision=revision[:MAX_REVISION],
        defaults={"path": path[:1000], "size_bytes": size},
    )
    _event(command.node_id, "model.downloaded", f"Model {model_id}@{revision} is in the cache", command=command)
    return row


def node_model_record_download_failed(*, command: Command) -> None:
    """A model.download failed: say why, with the fix, in the node's event log."""
    model = (command.payload or {}).get("model_id", "?")
    _failure_event(command, "model.failed", f"Download of {model} failed")


# --------------------------------------------------------------------------------------------------
# Endpoints


class PlacementError(IllegalTransition):
    """No node can take the workload (HTTP 409); `code` is a key of `error_help`."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def validate_model_id(model_id: Any, field: str = "model_id") -> str:
    """A Hugging Face model id: `owner/name` (or a legacy bare `name`), letters, digits, `-_.`."""
    if not isinstance(model_id, str):
        raise ValidationError({field: "Must be a string."})
    if len(model_id) > MAX_MODEL_ID:
        raise ValidationError({field: f"At most {MAX_MODEL_ID} characters."})
    if not re.match(MODEL_ID_RE, model_id) or ".." in model_id or "--" in model_id:
        raise ValidationError(
            {field: "Not a valid model id: expected owner/name with letters, digits, '-', '_' and '.'."}
        )
    return model_id


def _validate_revision(revision: Any) -> str:
    if not isinstance(revision, str) or not revision:
        raise ValidationError({"revision": "Must be a non-empty string."})
    if len(revision) > MAX_REVISION or not REVISION_RE.match(revision) or ".." in revision:
        raise ValidationError({"revision": "Not a valid revision (a branch, tag or commit hash)."})
    return revision


def _validate_count(value: Any, field: str, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise ValidationError({field: f"Must be an integer between 0 and {maximum}."})
    return value


def _endpoint_load(node_ids: list[Any]) -> dict[Any, tuple[int, int]]:
    """Per node: (live endpoints, VRAM reserved by endpoints still starting, not yet in heartbeats)."""
    rows = (
        Endpoint.objects.filter(node_id__in=node_ids, status__in=EndpointStatus.live())
        .values("node_id")
        .annotate(
            n=Count("pk"),
            reserved=Sum(
                "min_vram_mb", filter=Q(status__in=[EndpointStatus.PENDING, EndpointStatus.STARTING]), default=0
            ),
        )
    )
    return {r["node_id"]: (r["n"], r["reserved"]) for r in rows}


def _pick_endpoint_node(
    *, cluster: ComputeCluster, model_id: str, revision: str, gpus: int, min_vram_mb: int, node: Node | None
) -> Node:
    """Choose a node that has the model cached and enough GPUs/VRAM; PlacementError saying why not.

    Free VRAM counts the VRAM promised to endpoints that are still starting (not yet visible in the
    node's heartbeats). Among fitting nodes the one with the fewest live endpoints, then the most
    free VRAM, wins.
    """
    label = f"{model_id}@{revision}"
    if node is not None:
        node = Node.objects.get(pk=node.pk)
        if node.status != NodeStatus.ONLINE or not node.connected:
            raise IllegalTransition(f"Node {node.name} is {node.status}; endpoints start only on online nodes.")
        candidates = [node]
        if not NodeModel.objects.filter(node=node, model_id=model_id, revision=revision).exists():
            raise PlacementError(
                f"model weights are not yet downloaded: {label} is not in node {node.name}'s cache; "
                "run model.download on it first",
                "weights_missing",
            )
    else:
        candidates = list(
            Node.objects.filter(
                cluster=cluster,
                status=NodeStatus.ONLINE,
                connected=True,
                cached_models__model_id=model_id,
                cached_models__revision=revision,
            ).order_by("name", "pk")
        )
        if not candidates:
            raise PlacementError(
                f"model weights are not yet downloaded: {label} is on no online node; run model.download first",
                "model_not_downloaded",
            )
    load = _endpoint_load([n.pk for n in candidates])

    def free(n: Node) -> int:
        return node_free_vram_mb(n, gpus) - load.get(n.pk, (0, 0))[1]

    fitting = [n for n in candidates if n.gpu_count >= gpus and free(n) >= min_vram_mb]
    if not fitting:
        best = max(candidates, key=lambda n: (n.gpu_count >= gpus, free(n)))
        where = f"node {best.name}" if node is not None else f"best node {best.name}"
        gpu_note = f" (and {gpus} GPU(s), it has {best.gpu_count})" if best.gpu_count < gpus else ""
        raise PlacementError(
            f"insufficient GPU VRAM: needs {min_vram_mb} MB{gpu_note}, {where} has {max(free(best), 0)} MB free",
            "insufficient_vram",
        )
    return min(fitting, key=lambda n: (load.get(n.pk, (0, 0))[0], -free(n), n.name))


@operator_action(
    "endpoint.create",
    target=new("endpoint", name="model_id", within="cluster"),
    result=created("endpoint"),
    detail=lambda kw, _: {"model_id": str(kw.get("model_id"))[:200], "revision": str(kw.get("revision", "main"))[:200]},
)
def endpoint_create(
    *,
    actor: AbstractBaseUser,
    cluster: ComputeCluster,
    model_id: str,
    revision: str = "main",
    node: Node | None = None,
    gpus: int = 0,
    min_vram_mb: int = 0,
    public: bool = False,
) -> Endpoint:
    """Start an inference endpoint for a cached model; Owner/Admin only.

    Picks `node` or an online node of the cluster that has the model cached and enough GPUs/VRAM
    (the least busy), creates the Endpoint row (pending) and dispatches `endpoint.start`. Refuses
    with a 409 `PlacementError` saying why when no node qualifies; nothing is written then.
    """
    from fleet import services

    _require_operator(actor, cluster.workspace)
    validate_model_id(model_id)
    _validate_revision(revision)
    _validate_count(gpus, "gpus", 64)
    _validate_count(min_vram_mb, "min_vram_mb", 16 * 1024 * 1024)
    if not isinstance(public, bool):
        raise ValidationError({"public": "Must be a boolean."})
    if node is not None and node.cluster_id != cluster.pk:
        raise ValidationError({"node": "This node is not in this cluster."})
    with transaction.atomic():
        target = _pick_endpoint_node(
            cluster=cluster, model_id=model_id, revision=revision, gpus=gpus, min_vram_mb=min_vram_mb, node=node
        )
        endpoint = Endpoint.objects.create(
            cluster=cluster,
            node=target,
            model_id=model_id,
            revision=revision,
            gpus=gpus,
            min_vram_mb=min_vram_mb,
            public=public,
            created_by=actor,
        )
        (command,) = services.command_queue(
            actor=actor,
            cluster=cluster,
            command_type=CommandType.ENDPOINT_START,
            payload={
                "endpoint_id": endpoint.slug,
                "model_id": model_id,
                "revision": revision,
                "gpus": gpus,
                "min_vram_mb": min_vram_mb,
            },
            node=target,
        )
        endpoint.start_command = command
        endpoint.save(update_fields=["start_command", "updated_at"])
        _event(
            target.pk,
            "endpoint.starting",
            f"Endpoint {endpoint.hostname} for {model_id}@{revision} requested by {actor.get_username()}",
            data={"endpoint": str(endpoint.pk)},
            command=command,
        )
    return endpoint


@operator_action("endpoint.stop", target=on("endpoint", "endpoint"))
def endpoint_stop(*, actor: AbstractBaseUser, endpoint: Endpoint) -> Endpoint:
    """Stop an endpoint (→ stopping; → stopped when the agent confirms). Owner/Admin only; 409 if not live."""
    from fleet import services

    _require_operator(actor, endpoint.cluster.workspace)
    with transaction.atomic():
        endpoint = (
            Endpoint.objects.select_for_update(of=("self",)).select_related("node", "cluster").get(pk=endpoint.pk)
        )
        if endpoint.status not in EndpointStatus.live() or endpoint.status == EndpointStatus.STOPPING:
            raise IllegalTransition(f"This endpoint is {endpoint.status}; only a running or starting one can stop.")
        if endpoint.node is None:
            endpoint.status = EndpointStatus.STOPPED
            endpoint.save(update_fields=["status", "updated_at"])
            return endpoint
        (command,) = services.command_queue(
            actor=actor,
            cluster=endpoint.cluster,
            command_type=CommandType.ENDPOINT_STOP,
            payload={"endpoint_id": endpoint.slug},
            node=endpoint.node,
        )
        endpoint.status = EndpointStatus.STOPPING
        endpoint.stop_command = command
        endpoint.save(update_fields=["status", "stop_command", "updated_at"])
    return endpoint


def endpoint_record_start_commands(*, commands: list[Command]) -> list[Endpoint]:
    """endpoint.start commands queued (by `endpoint_create`, or sent from the Commands tab / API): each
    gets the Endpoint row its `endpoint_id` names, created when new, or made pending again on the
    command's node when it had stopped or failed, so every started endpoint is listed with its URL.

    Refuses (ValidationError) a start sent to several nodes at once, and an id of another cluster's or a
    still live endpoint on another node.
    """
    if len(commands) > 1:
        raise ValidationError({"node_id": "An endpoint starts on one node: choose the node."})
    rows = []
    for command in commands:
        payload = command.payload or {}
        slug = str(payload.get("endpoint_id", ""))
        endpoint = Endpoint.objects.select_for_update().filter(slug=slug).first()
        if endpoint is None:
            endpoint = Endpoint.objects.create(
                slug=slug,
                cluster_id=command.cluster_id,
                node_id=command.node_id,
                model_id=payload.get("model_id", ""),
                revision=payload.get("revision", "main"),
                gpus=payload.get("gpus", 0),
                min_vram_mb=payload.get("min_vram_mb", 0),
                created_by=command.created_by,
                start_command=command,
            )
            _event(
                command.node_id,
                "endpoint.starting",
                f"Endpoint {endpoint.hostname} for {endpoint.model_id}@{endpoint.revision} requested by "
                f"{command.created_by.get_username() if command.created_by else 'the control plane'}",
                data={"endpoint": str(endpoint.pk)},
                command=command,
            )
        elif endpoint.cluster_id != command.cluster_id:
            raise ValidationError({"payload.endpoint_id": "No such endpoint in this cluster."})
        elif endpoint.start_command_id is None:
            pass  # the row endpoint_create just made: it links its command itself
        elif endpoint.status in (EndpointStatus.STOPPED, EndpointStatus.FAILED):
            endpoint.status, endpoint.node_id, endpoint.port = EndpointStatus.PENDING, command.node_id, 0
            endpoint.model_id = payload.get("model_id", endpoint.model_id)
            endpoint.revision = payload.get("revision", "main")
            endpoint.start_command, endpoint.failure_code, endpoint.failure_message = command, "", ""
            endpoint.save()
        elif endpoint.node_id != command.node_id:
            raise ValidationError({"payload.endpoint_id": f"This endpoint is {endpoint.status} on another node."})
        rows.append(endpoint)
    return rows


@operator_action("endpoint.restart", target=on("endpoint", "endpoint"))
def endpoint_restart(*, actor: AbstractBaseUser, endpoint: Endpoint) -> Endpoint:
    """Start a stopped or failed endpoint again under the same id and URL (Owner/Admin only): placed like a
    new one (on a node holding the weights), its row pending again; 409 while it is live."""
    from fleet import services

    _require_operator(actor, endpoint.cluster.workspace)
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update(of=("self",)).select_related("cluster").get(pk=endpoint.pk)
        if endpoint.status not in (EndpointStatus.STOPPED, EndpointStatus.FAILED):
            raise IllegalTransition(f"This endpoint is {endpoint.status}; only a stopped or failed one can start.")
        target = _pick_endpoint_node(
            cluster=endpoint.cluster,
            model_id=endpoint.model_id,
            revision=endpoint.revision,
            gpus=endpoint.gpus,
            min_vram_mb=endpoint.min_vram_mb,
            node=None,
        )
        services.command_queue(  # endpoint_record_start_commands makes the row pending on `target`
            actor=actor,
            cluster=endpoint.cluster,
            command_type=CommandType.ENDPOINT_START,
            payload={
                "endpoint_id": endpoint.slug,
                "model_id": endpoint.model_id,
                "revision": endpoint.revision,
                "gpus": endpoint.gpus,
                "min_vram_mb": endpoint.min_vram_mb,
            },
            node=target,
        )
    endpoint.refresh_from_db()
    return endpoint


def _valid_port(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535 else 0


def endpoint_record_acked(*, command: Command) -> Endpoint | None:
    """The agent took the endpoint.start: pending → starting."""
    if command.command_type != CommandType.ENDPOINT_START:
        return None
    Endpoint.objects.filter(start_command=command, status=EndpointStatus.PENDING).update(
        status=EndpointStatus.STARTING, updated_at=timezone.now()
    )
    return Endpoint.objects.filter(start_command=command).first()


def endpoint_record_command_outcome(*, command: Command) -> Endpoint | None:
    """An endpoint.start / endpoint.stop finished: running with its port, stopped, or failed with the code."""
    if command.command_type not in (CommandType.ENDPOINT_START, CommandType.ENDPOINT_STOP):
        return None
    with transaction.atomic():
        field = "start_command" if command.command_type == CommandType.ENDPOINT_START else "stop_command"
        endpoint = Endpoint.objects.select_for_update().filter(**{field: command}).first()
        if endpoint is None:
            slug = str((command.payload or {}).get("endpoint_id", ""))
            endpoint = Endpoint.objects.select_for_update().filter(slug=slug, cluster_id=command.cluster_id).first()
        if endpoint is None:
            return None
        ok = command.status == CommandStatus.SUCCEEDED
        if command.command_type == CommandType.ENDPOINT_START:
            if endpoint.status not in (EndpointStatus.PENDING, EndpointStatus.STARTING):
                return endpoint  # stopped meanwhile, or a duplicate outcome
            port = _valid_port((command.result or {}).get("port"))
            if ok and port:
                endpoint.status, endpoint.port = EndpointStatus.RUNNING, port
                endpoint.failure_code = endpoint.failure_message = ""
                _event(
                    command.node_id,
                    "endpoint.running",
                    f"Endpoint {endpoint.url} is running on port {port}",
                    command=command,
                )
            else:
                code = command.error_code if not ok else "internal"
                message = command.error_message if not ok else "The agent reported success without a valid port."
                endpoint.status = EndpointStatus.FAILED
                endpoint.failure_code, endpoint.failure_message = code, message
                _event(
                    command.node_id,
                    "endpoint.failed",
                    f"Endpoint {endpoint.hostname} failed to start: {error_sentence(code, message)}",
                    data={"error_help": error_help(code)},
                    command=command,
                )
        elif ok or command.error_code == "not_found":
            endpoint.status = EndpointStatus.STOPPED
            _event(command.node_id, "endpoint.stopped", f"Endpoint {endpoint.hostname} stopped", command=command)
        else:
            endpoint.status = EndpointStatus.RUNNING if endpoint.port else EndpointStatus.FAILED
            endpoint.failure_code, endpoint.failure_message = command.error_code, command.error_message
            _failure_event(command, "endpoint.failed", f"Endpoint {endpoint.hostname} could not be stopped")
        endpoint.save()
    return endpoint


def endpoints_reconcile(*, node: Node, inventory: protocol.Inventory) -> int:
    """Running endpoints the agent reports update their rows (port, status); running rows it no longer
    reports become failed (the process is gone). Returns how many rows changed."""
    reported = {e.endpoint_id: e for e in inventory.endpoints}
    changed = 0
    with transaction.atomic():
        for endpoint in Endpoint.objects.select_for_update().filter(
            node=node, status__in=[EndpointStatus.STARTING, EndpointStatus.RUNNING, EndpointStatus.PENDING]
        ):
            info = reported.get(endpoint.slug)
            if info is None:
                if endpoint.status != EndpointStatus.RUNNING:
                    continue  # start still in flight
                endpoint.status = EndpointStatus.FAILED
                endpoint.failure_code = "not_found"
                endpoint.failure_message = "The node no longer runs this endpoint (agent or node restarted?)."
                _event(node.pk, "endpoint.failed", f"Endpoint {endpoint.hostname} is gone from the node")
            elif info.status == "running" and _valid_port(info.port):
                if endpoint.status == EndpointStatus.RUNNING and endpoint.port == info.port:
                    continue
                endpoint.status, endpoint.port = EndpointStatus.RUNNING, info.port
            elif info.status in ("stopped", "failed"):
                endpoint.status = EndpointStatus(info.status)
            else:
                continue
            endpoint.save()
            changed += 1
    return changed

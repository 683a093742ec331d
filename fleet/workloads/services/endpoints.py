"""Inference endpoints: placement on a node holding the model, start, stop and restart (Owner/Admin), and
the rows following their commands' outcomes and the nodes' inventories."""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from agent import protocol
from agent.protocol import MODEL_ID_RE
from cleverthis.audit.services import created, new, on, operator_action
from cleverthis.tenancy.mixins import require_operator
from cleverthis.tenancy.quotas import admit, locked_quota
from fleet.models import Command, CommandStatus, CommandType, ComputeCluster, Node, NodeStatus
from fleet.services import command_queue, node_event_record
from fleet.workloads.errors import error_help, error_sentence
from fleet.workloads.models import Endpoint, EndpointStatus, NodeModel
from fleet.workloads.quotas import endpoint_ask
from fleet.workloads.services.common import MAX_MODEL_ID, MAX_REVISION, node_event_record_failure
from kernel.exceptions import IllegalTransition

REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]*$")


def node_free_vram_mb(node: Node, gpus: int = 0) -> int:
    """Free VRAM: on the `gpus` GPUs with most free memory, or on all GPUs when `gpus` is 0."""
    per_gpu = sorted(
        (max(int(g.get("memory_total_mb", 0)) - int(g.get("memory_used_mb", 0)), 0) for g in node.gpus or []),
        reverse=True,
    )
    if not per_gpu:
        return max(node.vram_total_mb - node.vram_used_mb, 0)
    return sum(per_gpu[:gpus] if gpus > 0 else per_gpu)


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
    with a 409 `PlacementError` saying why when no node qualifies, or `QuotaExceeded` when the workspace's
    endpoint, GPU or VRAM quota would be passed; nothing is written then.
    """
    require_operator(actor, cluster.workspace)
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
        admit(workspace_id=cluster.workspace_id, ask=endpoint_ask(gpus=gpus, min_vram_mb=min_vram_mb))
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
        (command,) = command_queue(
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
        node_event_record(
            node_id=target.pk,
            kind="endpoint.starting",
            message=f"Endpoint {endpoint.hostname} for {model_id}@{revision} requested by {actor.get_username()}",
            data={"endpoint": str(endpoint.pk)},
            command=command,
        )
    return endpoint


@operator_action("endpoint.stop", target=on("endpoint", "endpoint"))
def endpoint_stop(*, actor: AbstractBaseUser, endpoint: Endpoint) -> Endpoint:
    """Stop an endpoint (→ stopping; → stopped when the agent confirms). Owner/Admin only; 409 if not live."""
    require_operator(actor, endpoint.cluster.workspace)
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
        (command,) = command_queue(
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


def _start_ask(payload: dict[str, Any]) -> dict[str, float]:
    return endpoint_ask(gpus=int(payload.get("gpus") or 0), min_vram_mb=int(payload.get("min_vram_mb") or 0))


def endpoint_record_start_commands(*, commands: list[Command]) -> list[Endpoint]:
    """endpoint.start commands queued (by `endpoint_create`, or sent from the Commands tab / API): each
    gets the Endpoint row its `endpoint_id` names, created when new, or made pending again on the
    command's node when it had stopped or failed, so every started endpoint is listed with its URL.

    Refuses (ValidationError) a start sent to several nodes at once, and an id of another cluster's or a
    still live endpoint on another node; a new or restarted endpoint is admitted against the workspace's
    quotas first (`QuotaExceeded`). A live endpoint counts already: starting it again asks nothing.
    """
    if len(commands) > 1:
        raise ValidationError({"node_id": "An endpoint starts on one node: choose the node."})
    rows = []
    for command in commands:
        payload = command.payload or {}
        slug = str(payload.get("endpoint_id", ""))
        endpoint = Endpoint.objects.select_for_update().filter(slug=slug).first()
        if endpoint is None:
            admit(workspace_id=command.cluster.workspace_id, ask=_start_ask(payload))
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
            node_event_record(
                node_id=command.node_id,
                kind="endpoint.starting",
                message=f"Endpoint {endpoint.hostname} for {endpoint.model_id}@{endpoint.revision} requested by "
                f"{command.created_by.get_username() if command.created_by else 'the control plane'}",
                data={"endpoint": str(endpoint.pk)},
                command=command,
            )
        elif endpoint.cluster_id != command.cluster_id:
            raise ValidationError({"payload.endpoint_id": "No such endpoint in this cluster."})
        elif endpoint.start_command_id is None:
            pass  # the row endpoint_create just made: it links its command itself
        elif endpoint.status in (EndpointStatus.STOPPED, EndpointStatus.FAILED):
            admit(workspace_id=command.cluster.workspace_id, ask=_start_ask(payload))
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
    require_operator(actor, endpoint.cluster.workspace)
    with transaction.atomic():
        locked_quota(endpoint.cluster.workspace_id)  # before the row: the lock order of admissions
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
        command_queue(  # endpoint_record_start_commands makes the row pending on `target`
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
            result: protocol.EndpointStartResult | None = command.parsed_result
            port = _valid_port(result.port if result is not None else None)
            if ok and port:
                endpoint.status, endpoint.port = EndpointStatus.RUNNING, port
                endpoint.failure_code = endpoint.failure_message = ""
                node_event_record(
                    node_id=command.node_id,
                    kind="endpoint.running",
                    message=f"Endpoint {endpoint.url} is running on port {port}",
                    command=command,
                )
            else:
                code = command.error_code if not ok else "internal"
                message = command.error_message if not ok else "The agent reported success without a valid port."
                endpoint.status = EndpointStatus.FAILED
                endpoint.failure_code, endpoint.failure_message = code, message
                node_event_record(
                    node_id=command.node_id,
                    kind="endpoint.failed",
                    message=f"Endpoint {endpoint.hostname} failed to start: {error_sentence(code, message)}",
                    data={"error_help": error_help(code)},
                    command=command,
                )
        elif ok or command.error_code == "not_found":
            endpoint.status = EndpointStatus.STOPPED
            node_event_record(
                node_id=command.node_id,
                kind="endpoint.stopped",
                message=f"Endpoint {endpoint.hostname} stopped",
                command=command,
            )
        else:
            endpoint.status = EndpointStatus.RUNNING if endpoint.port else EndpointStatus.FAILED
            endpoint.failure_code, endpoint.failure_message = command.error_code, command.error_message
            node_event_record_failure(
                command=command, kind="endpoint.failed", what=f"Endpoint {endpoint.hostname} could not be stopped"
            )
        endpoint.save()
    return endpoint


def endpoints_end_with_node(*, node: Node, reachable: bool) -> int:
    """The live endpoints of a node being deleted (inside its transaction); returns how many changed.

    With a tunnel open the agent is told to stop what it started before it exits (revocation): the endpoints
    are stopped. Without one nothing can reach their servers: they fail as lost, and say so.
    """
    if reachable:
        status, code = EndpointStatus.STOPPED, "node_deleted"
        message = f"Node {node.name} was deleted: its agent was told to stop this endpoint's server."
    else:
        status, code = EndpointStatus.FAILED, "node_lost"
        message = (
            f"Node {node.name} was deleted while its agent was offline: this endpoint's server could not be "
            "reached and may still run on that machine."
        )
    return Endpoint.objects.filter(node=node, status__in=EndpointStatus.live()).update(
        status=status, failure_code=code, failure_message=message, updated_at=timezone.now()
    )


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
                node_event_record(
                    node_id=node.pk,
                    kind="endpoint.failed",
                    message=f"Endpoint {endpoint.hostname} is gone from the node",
                )
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

"""Inference endpoints: their replicas' placement on nodes holding the model, start, stop and restart
(Owner, Admin, Member), and the rows following their commands' outcomes and the nodes' inventories.

An endpoint keeps `min_replicas` replicas (`EndpointReplica`), each one server on a node; its own status
summarises theirs (`endpoint_replicas.endpoint_summarise`). Lock order: the endpoint's row, then its replicas'.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from agent import protocol
from agent.protocol import MODEL_ID_RE
from agent.protocol.rules import MAX_ITEMS
from audit.services import created, new, on, operator_action
from fleet.models import Command, CommandStatus, CommandType, ComputeCluster, Node, NodeStatus
from fleet.payloads import MARKS
from fleet.services import command_queue
from fleet.workloads.errors import error_help, error_sentence
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus, NodeModel
from fleet.workloads.quotas import replica_ask
from fleet.workloads.services.common import MAX_MODEL_ID, MAX_REVISION, system_actor
from fleet.workloads.services.endpoint_events import endpoint_event_record
from fleet.workloads.services.endpoint_replicas import endpoint_summarise, replica_queue_start, replica_queue_stop
from kernel.exceptions import IllegalTransition
from tenancy.mixins import require_editor
from tenancy.quotas import admit, locked_quota

# The failure code of a replica whose server stopped answering the agent's health probes (also the
# status the agent reports for it: `agent.protocol.EndpointInfo`).
UNRESPONSIVE = "unresponsive"
REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]*$")
MAX_REPLICAS = 32
MAX_TARGET_IN_FLIGHT = 100_000  # autoscaling targets per replica (0 = off)
MAX_TARGET_TOKENS_PER_S = 10_000_000
MAX_IDLE_TIMEOUT_S = 30 * 86_400
# An endpoint's server arguments travel as endpoint.start's `extra_args`: the payload's bounds.
MAX_SERVER_ARGS = MAX_ITEMS
MAX_SERVER_ARG_LENGTH = 500
# "--max-model-len 2048" given as one item: an option and its value, split in two as a shell would.
_OPTION_AND_VALUE = re.compile(r"^(--?[A-Za-z][A-Za-z0-9_.-]*)\s+(\S.*)$", re.DOTALL)


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


def validate_revision(revision: Any) -> str:
    if not isinstance(revision, str) or not revision:
        raise ValidationError({"revision": "Must be a non-empty string."})
    if len(revision) > MAX_REVISION or not REVISION_RE.match(revision) or ".." in revision:
        raise ValidationError({"revision": "Not a valid revision (a branch, tag or commit hash)."})
    return revision


def validate_server_args(value: Any, field: str = "server_args") -> list[str]:
    """The server arguments every replica of an endpoint starts with, as vLLM takes them: a list of strings
    (an option and its value given as one item, `"--max-model-len 2048"`, become two items), at most
    `MAX_SERVER_ARGS` of at most `MAX_SERVER_ARG_LENGTH` characters; never a flag the agent sets itself
    (`protocol.ENDPOINT_AGENT_ARGS`: port, host, model, ...), named in the message. ValidationError on `field`."""
    if not isinstance(value, list) or not all(isinstance(arg, str) for arg in value):
        raise ValidationError({field: "Must be a list of strings, one server argument each."})
    if len(value) > MAX_SERVER_ARGS:  # before looking at each one
        raise ValidationError({field: f"At most {MAX_SERVER_ARGS} arguments (got {len(value)})."})
    args: list[str] = []
    for arg in value:
        match = _OPTION_AND_VALUE.match(arg)
        args += [match.group(1), match.group(2)] if match else [arg]
    problems = []
    if len(args) > MAX_SERVER_ARGS:
        problems.append(f"At most {MAX_SERVER_ARGS} arguments (got {len(args)}).")
    for arg in args:
        shown = arg if len(arg) <= 40 else arg[:40] + "…"
        if len(arg) > MAX_SERVER_ARG_LENGTH:
            problems.append(f"{shown!r}: at most {MAX_SERVER_ARG_LENGTH} characters per argument.")
        elif "\x00" in arg:
            problems.append(f"{shown!r}: an argument cannot hold a NUL character.")
        elif (reserved := protocol.endpoint_arg_reserved(arg)) is not None:
            said = reserved if arg.split("=", 1)[0] == reserved else f"{shown!r} (read by vLLM as {reserved})"
            problems.append(
                f"{said} is set by the agent itself ({protocol.ENDPOINT_AGENT_ARGS[reserved]}): leave it out."
            )
    if problems:
        raise ValidationError({field: problems})
    return args


def _validate_count(value: Any, field: str, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise ValidationError({field: f"Must be an integer between 0 and {maximum}."})
    return value


def _endpoint_load(node_ids: list[Any]) -> dict[Any, tuple[int, int]]:
    """Per node: (live endpoint replicas, VRAM reserved by replicas still starting, not yet in heartbeats)."""
    rows = (
        EndpointReplica.objects.filter(node_id__in=node_ids, status__in=EndpointStatus.live())
        .values("node_id")
        .annotate(
            n=Count("pk"),
            reserved=Sum(
                "endpoint__min_vram_mb",
                filter=Q(status__in=[EndpointStatus.PENDING, EndpointStatus.STARTING]),
                default=0,
            ),
        )
    )
    return {r["node_id"]: (r["n"], r["reserved"]) for r in rows}


def pick_endpoint_node(
    *,
    cluster: ComputeCluster,
    model_id: str,
    revision: str,
    gpus: int,
    min_vram_mb: int,
    node: Node | None,
    avoid: Collection[Any] = (),
) -> Node:
    """Choose a node that has the model cached and enough GPUs/VRAM; PlacementError saying why not.

    Free VRAM counts the VRAM promised to replicas that are still starting (not yet visible in the
    node's heartbeats). Among fitting nodes one not in `avoid` (the ids of nodes already serving this
    endpoint) wins where there is one, then the one with the fewest live replicas, then the most free VRAM.
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
    return min(fitting, key=lambda n: (n.pk in avoid, load.get(n.pk, (0, 0))[0], -free(n), n.name))


def pick_replica_node(
    endpoint: Endpoint, *, avoid: Collection[Any] = (), node: Node | None = None, revision: str | None = None
) -> Node:
    """Where one more replica of `endpoint` goes (`pick_endpoint_node` with its model, GPUs and VRAM; of
    `revision` when given, for a rolling update); PlacementError when it fits nowhere."""
    return pick_endpoint_node(
        cluster=endpoint.cluster,
        model_id=endpoint.model_id,
        revision=endpoint.revision if revision is None else revision,
        gpus=endpoint.gpus,
        min_vram_mb=endpoint.min_vram_mb,
        node=node,
        avoid=avoid,
    )


def _workspace_of_endpoint(endpoint_id: object) -> object:
    """The workspace id of an endpoint (None when it is gone): to lock its quota row before the endpoint's."""
    return Endpoint.objects.filter(pk=endpoint_id).values_list("cluster__workspace_id", flat=True).first()


def lock_endpoint(endpoint_id: object) -> Endpoint | None:
    """For a pass that may start replicas (inside its transaction): lock the workspace's quota row, then the
    endpoint's (the lock order of admissions, `tenancy.quotas`); the endpoint with its cluster and workspace,
    or None when it is gone."""
    workspace_id = _workspace_of_endpoint(endpoint_id)
    if workspace_id is None:
        return None
    locked_quota(workspace_id)
    return (
        Endpoint.objects.select_for_update(of=("self",))
        .select_related("cluster__workspace")
        .filter(pk=endpoint_id)
        .first()
    )


def _place_replicas(*, actor: AbstractBaseUser, endpoint: Endpoint, node: Node | None = None) -> list[Command]:
    """Start each of the endpoint's replicas (made up to `min_replicas`, at least one) on a node of its own
    where one fits; the first replica's server id is the endpoint's slug. PlacementError (nothing kept) when
    one fits nowhere."""
    wanted = max(endpoint.min_replicas, 1)  # one that scales to zero starts with one, until it idles
    current = endpoint.replicas.filter(replacements__isnull=True).order_by("created_at", "server_id")
    replicas = list(current[:wanted])  # replicas the autoscaler added and stopped stay stopped
    while len(replicas) < wanted:
        server_id = endpoint.slug if not replicas else EndpointReplica._meta.get_field("server_id").get_default()
        replicas.append(EndpointReplica.objects.create(endpoint=endpoint, server_id=server_id))
    commands, used = [], set()
    for replica in replicas:
        target = pick_replica_node(endpoint, avoid=used, node=node)
        used.add(target.pk)
        EndpointReplica.objects.filter(pk=replica.pk).update(node=target)  # pending once its start is queued (admitted)
        commands.append(replica_queue_start(actor=actor, endpoint=endpoint, replica=replica, node=target))
    return commands


@operator_action(
    "endpoint.create",
    target=new("endpoint", name="model_id", within="cluster"),
    result=created("endpoint"),
    detail=lambda kw, value: {
        "model_id": str(kw.get("model_id"))[:200],
        "revision": str(kw.get("revision", "main"))[:200],
        **({"server_args": value.server_args} if value is not None and value.server_args else {}),
    },
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
    min_replicas: int = 1,
    max_replicas: int | None = None,
    target_requests_per_min: int = 0,
    target_in_flight: int = 0,
    target_tokens_per_s: int = 0,
    scale_cooldown_s: int = 120,
    idle_timeout_s: int = 300,
    server_args: list[str] | None = None,
) -> Endpoint:
    """Start an inference endpoint for a cached model with `min_replicas` replicas; Owner, Admin or Member.

    Places each replica on `node` or on an online node of the cluster that has the model cached and
    enough GPUs/VRAM (distinct nodes where they fit, the least busy first), creates the Endpoint and
    replica rows (pending) and dispatches one `endpoint.start` per replica. Refuses with a 409
    `PlacementError` saying why when a replica fits on no node, or `QuotaExceeded` when the workspace's
    endpoint, GPU or VRAM quota would be passed (each replica asks the endpoint's GPUs and VRAM); nothing
    is written then. With `target_requests_per_min`, `target_in_flight` or `target_tokens_per_s` (per
    replica; 0 = off) the autoscaler keeps between min and max replicas on that load. With `min_replicas` 0
    it starts one replica and scales to zero after `idle_timeout_s` seconds without requests
    (`endpoint_idle`); the next request starts one again. Every replica's server starts with `server_args`
    (`validate_server_args`).
    """
    require_editor(actor, cluster.workspace, what="create endpoints")
    validate_model_id(model_id)
    validate_revision(revision)
    server_args = validate_server_args([] if server_args is None else server_args)
    _validate_count(gpus, "gpus", 64)
    _validate_count(min_vram_mb, "min_vram_mb", 16 * 1024 * 1024)
    if not isinstance(public, bool):
        raise ValidationError({"public": "Must be a boolean."})
    if node is not None and node.cluster_id != cluster.pk:
        raise ValidationError({"node": "This node is not in this cluster."})
    _validate_count(min_replicas, "min_replicas", MAX_REPLICAS)
    max_replicas = max(min_replicas, 1) if max_replicas is None else max_replicas
    _validate_count(max_replicas, "max_replicas", MAX_REPLICAS)
    if max_replicas < max(min_replicas, 1):
        raise ValidationError({"max_replicas": "Must be at least min_replicas, and at least 1."})
    _validate_count(idle_timeout_s, "idle_timeout_s", MAX_IDLE_TIMEOUT_S)
    if min_replicas == 0 and idle_timeout_s < 1:
        raise ValidationError(
            {"idle_timeout_s": "An endpoint that scales to zero (min_replicas 0) needs an idle timeout of 1 s or more."}
        )
    _validate_count(target_requests_per_min, "target_requests_per_min", 10_000_000)
    _validate_count(target_in_flight, "target_in_flight", MAX_TARGET_IN_FLIGHT)
    _validate_count(target_tokens_per_s, "target_tokens_per_s", MAX_TARGET_TOKENS_PER_S)
    _validate_count(scale_cooldown_s, "scale_cooldown_s", 86_400)
    if node is not None and min_replicas > 1:
        raise ValidationError({"node": "A chosen node takes one replica: leave it out to place several."})
    with transaction.atomic():
        admit(workspace_id=cluster.workspace_id, ask={"endpoints": 1})  # its replicas: as their starts queue
        endpoint = Endpoint.objects.create(
            cluster=cluster,
            model_id=model_id,
            revision=revision,
            gpus=gpus,
            min_vram_mb=min_vram_mb,
            public=public,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            target_requests_per_min=target_requests_per_min,
            target_in_flight=target_in_flight,
            target_tokens_per_s=target_tokens_per_s,
            scale_cooldown_s=scale_cooldown_s,
            idle_timeout_s=idle_timeout_s,
            server_args=server_args,
            created_by=actor,
        )
        commands = _place_replicas(actor=actor, endpoint=endpoint, node=node)
        endpoint.start_command = commands[0]
        endpoint.save(update_fields=["start_command", "updated_at"])
        endpoint = endpoint_summarise(endpoint)
        for command in commands:
            endpoint_event_record(
                endpoint=endpoint,
                node_id=command.node_id,
                kind="endpoint.starting",
                message=f"Endpoint {endpoint.hostname} for {model_id}@{revision} requested by {actor.get_username()}",
                command=command,
            )
    return endpoint


@operator_action("endpoint.stop", target=on("endpoint", "endpoint"))
def endpoint_stop(*, actor: AbstractBaseUser, endpoint: Endpoint) -> Endpoint:
    """Stop an endpoint (→ stopping; → stopped when the agent confirms), or one scaled to zero (→ stopped: no
    request wakes it any more). Owner, Admin or Member; 409 if not live or idle."""
    require_editor(actor, endpoint.cluster.workspace, what="stop endpoints")
    with transaction.atomic():
        endpoint = (
            Endpoint.objects.select_for_update(of=("self",)).select_related("node", "cluster").get(pk=endpoint.pk)
        )
        if endpoint.status not in EndpointStatus.kept() or endpoint.status == EndpointStatus.STOPPING:
            raise IllegalTransition(f"This endpoint is {endpoint.status}; only a running or starting one can stop.")
        if endpoint.idle_since is not None or endpoint.status == EndpointStatus.IDLE:
            endpoint.idle_since = None
            endpoint.status = EndpointStatus.STOPPED  # its replicas are all stopped or on their way
            endpoint.save(update_fields=["idle_since", "status", "updated_at"])
        live = [EndpointStatus.PENDING, EndpointStatus.STARTING, EndpointStatus.RUNNING]
        replicas = endpoint.replicas.select_for_update(of=("self",)).select_related("node").filter(status__in=live)
        commands = [replica_queue_stop(actor=actor, endpoint=endpoint, replica=r) for r in replicas]
        sent = [c for c in commands if c is not None]
        if sent:
            endpoint.stop_command = sent[0]
            endpoint.save(update_fields=["stop_command", "updated_at"])
        endpoint_summarise(endpoint)
    return endpoint


def _replica_ask(endpoint: Endpoint) -> dict[str, float]:
    return replica_ask(gpus=endpoint.gpus, min_vram_mb=endpoint.min_vram_mb)


def _new_endpoint_ask(payload: dict[str, Any]) -> dict[str, float]:
    ask = replica_ask(gpus=int(payload.get("gpus") or 0), min_vram_mb=int(payload.get("min_vram_mb") or 0))
    return {"endpoints": 1, **ask}


def endpoint_record_start_commands(*, commands: list[Command]) -> list[Endpoint]:
    """endpoint.start commands queued (by the services here, or sent from the Commands tab / API): each
    gets the replica its `endpoint_id` names (a replica's server id; an endpoint's slug names its first
    replica), created with its Endpoint row when new, or made pending again on the command's node when it
    had stopped or failed, so every started server is listed with its endpoint's URL.

    Refuses (ValidationError) a start sent to several nodes at once, and an id of another cluster's or a
    still live replica on another node. Each replica that goes live is admitted against the workspace's
    quotas as its start is queued (`QuotaExceeded`): the endpoint's GPUs and VRAM, and the endpoint itself
    when it was neither live nor scaled to zero (`EndpointStatus.kept()`); a live replica counts already,
    starting it again asks nothing. A replica started again comes back into rotation (and its endpoint awake).
    """
    if len(commands) > 1:
        raise ValidationError({"node_id": "An endpoint starts on one node: choose the node."})
    rows = []
    for command in commands:
        payload = command.payload or {}
        if "extra_args" in (payload.get(MARKS) or ()):
            raise ValidationError(
                {
                    f"payload.{MARKS}": "An endpoint keeps its server arguments (extra_args) to start every "
                    "replica with, shown to its workspace: they cannot be secret."
                }
            )
        server_args = validate_server_args(payload.get("extra_args", []), "payload.extra_args")
        server_id = str(payload.get("endpoint_id", ""))
        found = EndpointReplica.objects.filter(server_id=server_id).values_list("endpoint_id", flat=True).first()
        endpoint = (
            Endpoint.objects.select_for_update().filter(pk=found).first()
            if found
            else Endpoint.objects.select_for_update().filter(slug=server_id).first()
        )
        if endpoint is not None and endpoint.cluster_id != command.cluster_id:
            raise ValidationError({"payload.endpoint_id": "No such endpoint in this cluster."})
        created = endpoint is None
        if endpoint is None:
            admit(workspace_id=command.cluster.workspace_id, ask=_new_endpoint_ask(payload))
            endpoint = Endpoint.objects.create(
                slug=server_id,
                cluster_id=command.cluster_id,
                node_id=command.node_id,
                model_id=payload.get("model_id", ""),
                revision=payload.get("revision", "main"),
                gpus=payload.get("gpus", 0),
                min_vram_mb=payload.get("min_vram_mb", 0),
                server_args=server_args,
                created_by=command.created_by,
                start_command=command,
            )
            endpoint_event_record(
                endpoint=endpoint,
                node_id=command.node_id,
                kind="endpoint.starting",
                message=f"Endpoint {endpoint.hostname} for {endpoint.model_id}@{endpoint.revision} requested by "
                f"{command.created_by.get_username() if command.created_by else 'the control plane'}",
                command=command,
            )
        replica = EndpointReplica.objects.select_for_update().filter(server_id=server_id).first()
        if replica is None:
            if not created:
                admit(workspace_id=command.cluster.workspace_id, ask=_replica_ask(endpoint))
            EndpointReplica.objects.create(
                endpoint=endpoint, server_id=server_id, node_id=command.node_id, start_command=command
            )
        elif replica.start_command_id is None:
            # a replica the services here just made: it counts once they link this command to it
            admit(workspace_id=command.cluster.workspace_id, ask=_replica_ask(endpoint))
        elif replica.status in (EndpointStatus.STOPPED, EndpointStatus.FAILED):
            ask = _replica_ask(endpoint)
            if endpoint.status not in EndpointStatus.kept():  # an idle endpoint counts already
                ask["endpoints"] = 1
            admit(workspace_id=command.cluster.workspace_id, ask=ask)
            replica.status, replica.node_id, replica.port = EndpointStatus.PENDING, command.node_id, 0
            replica.start_command, replica.failure_code, replica.failure_message = command, "", ""
            replica.retired_at = None
            replica.save()
            endpoint.model_id = payload.get("model_id", endpoint.model_id)
            endpoint.revision = payload.get("revision", "main")
            endpoint.server_args = server_args
            endpoint.start_command, endpoint.idle_since = command, None
            endpoint.save(
                update_fields=["model_id", "revision", "server_args", "start_command", "idle_since", "updated_at"]
            )
        elif replica.node_id != command.node_id:
            raise ValidationError({"payload.endpoint_id": f"This endpoint is {replica.status} on another node."})
        rows.append(endpoint_summarise(endpoint))
    return rows


@operator_action("endpoint.restart", target=on("endpoint", "endpoint"))
def endpoint_restart(*, actor: AbstractBaseUser, endpoint: Endpoint) -> Endpoint:
    """Start a stopped or failed endpoint again under the same id and URL (Owner, Admin or Member): its replicas
    placed like a new endpoint's (on nodes holding the weights), pending again; 409 while it is live."""
    require_editor(actor, endpoint.cluster.workspace, what="start endpoints")
    with transaction.atomic():
        locked_quota(endpoint.cluster.workspace_id)  # before the row: the lock order of admissions
        endpoint = Endpoint.objects.select_for_update(of=("self",)).select_related("cluster").get(pk=endpoint.pk)
        if endpoint.status not in (EndpointStatus.STOPPED, EndpointStatus.FAILED):
            raise IllegalTransition(f"This endpoint is {endpoint.status}; only a stopped or failed one can start.")
        commands = _place_replicas(actor=actor, endpoint=endpoint)
        endpoint.start_command = commands[0]
        endpoint.save(update_fields=["start_command", "updated_at"])
        endpoint_summarise(endpoint)
    endpoint.refresh_from_db()
    return endpoint


def _valid_port(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535 else 0


def endpoint_record_acked(*, command: Command) -> Endpoint | None:
    """The agent took a replica's endpoint.start: pending → starting."""
    if command.command_type != CommandType.ENDPOINT_START:
        return None
    endpoint_id = EndpointReplica.objects.filter(start_command=command).values_list("endpoint_id", flat=True).first()
    if endpoint_id is None:
        return None
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update().get(pk=endpoint_id)
        EndpointReplica.objects.filter(start_command=command, status=EndpointStatus.PENDING).update(
            status=EndpointStatus.STARTING, updated_at=timezone.now()
        )
        return endpoint_summarise(endpoint)


def _replica_of(command: Command, field: str) -> EndpointReplica | None:
    replica = EndpointReplica.objects.filter(**{field: command}).first()
    if replica is None:
        server_id = str((command.payload or {}).get("endpoint_id", ""))
        replica = EndpointReplica.objects.filter(server_id=server_id, endpoint__cluster_id=command.cluster_id).first()
    return replica


def endpoint_record_command_outcome(*, command: Command) -> Endpoint | None:
    """A replica's endpoint.start / endpoint.stop finished: running with its port, stopped, or failed with
    the code (a failed replica whose server was told to stop stays failed); the endpoint summarises its
    replicas again."""
    if command.command_type not in (CommandType.ENDPOINT_START, CommandType.ENDPOINT_STOP):
        return None
    field = "start_command" if command.command_type == CommandType.ENDPOINT_START else "stop_command"
    found = _replica_of(command, field)
    if found is None:
        return None
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update().get(pk=found.endpoint_id)
        replica = EndpointReplica.objects.select_for_update().get(pk=found.pk)
        ok = command.status == CommandStatus.SUCCEEDED
        if command.command_type == CommandType.ENDPOINT_START:
            if replica.status not in (EndpointStatus.PENDING, EndpointStatus.STARTING):
                return endpoint  # stopped meanwhile, or a duplicate outcome
            result: protocol.EndpointStartResult | None = command.parsed_result
            port = _valid_port(result.port if result is not None else None)
            if ok and port:
                replica.status, replica.port = EndpointStatus.RUNNING, port
                replica.failure_code = replica.failure_message = ""
                endpoint_event_record(
                    endpoint=endpoint,
                    node_id=command.node_id,
                    kind="endpoint.running",
                    message=f"Endpoint {endpoint.url}: replica {replica.server_id} is running on port {port}",
                    command=command,
                )
            else:
                code = command.error_code if not ok else "internal"
                message = command.error_message if not ok else "The agent reported success without a valid port."
                replica.status = EndpointStatus.FAILED
                replica.failure_code, replica.failure_message = code, message
                endpoint_event_record(
                    endpoint=endpoint,
                    node_id=command.node_id,
                    kind="endpoint.failed",
                    message=f"Endpoint {endpoint.hostname}: replica {replica.server_id} failed to start: "
                    f"{error_sentence(code, message)}",
                    data={"error_help": error_help(code)},
                    command=command,
                )
        elif replica.status == EndpointStatus.FAILED:  # the stop of a failed replica's server (a hung one)
            if ok or command.error_code == "not_found":
                endpoint_event_record(
                    endpoint=endpoint,
                    node_id=command.node_id,
                    kind="endpoint.stopped",
                    message=f"Endpoint {endpoint.hostname}: the server of failed replica {replica.server_id} stopped",
                    command=command,
                )
            else:
                endpoint_event_record(
                    endpoint=endpoint,
                    node_id=command.node_id,
                    kind="endpoint.failed",
                    message=f"Endpoint {endpoint.hostname}: the server of failed replica {replica.server_id} "
                    f"could not be stopped: {error_sentence(command.error_code, command.error_message)}",
                    data={"error_help": error_help(command.error_code)},
                    command=command,
                )
            return endpoint  # it stays failed, with why
        elif ok or command.error_code == "not_found":
            replica.status = EndpointStatus.STOPPED
            endpoint_event_record(
                endpoint=endpoint,
                node_id=command.node_id,
                kind="endpoint.stopped",
                message=f"Endpoint {endpoint.hostname}: replica {replica.server_id} stopped",
                command=command,
            )
        else:
            replica.status = EndpointStatus.RUNNING if replica.port else EndpointStatus.FAILED
            replica.failure_code, replica.failure_message = command.error_code, command.error_message
            endpoint_event_record(
                endpoint=endpoint,
                node_id=command.node_id,
                kind="endpoint.failed",
                message=f"Endpoint {endpoint.hostname}: replica {replica.server_id} could not be stopped: "
                f"{error_sentence(command.error_code, command.error_message)}",
                data={"error_help": error_help(command.error_code)},
                command=command,
            )
        replica.save()
        return endpoint_summarise(endpoint)


def _lock_endpoints_on(node: Node, statuses: Collection[str]) -> list[Endpoint]:
    """Lock (in a stable order) the endpoints with a replica on `node` in one of `statuses`."""
    ids = EndpointReplica.objects.filter(node=node, status__in=statuses).values("endpoint_id")
    return list(Endpoint.objects.select_for_update().filter(pk__in=ids).order_by("pk"))


def endpoints_end_with_node(*, node: Node, reachable: bool) -> int:
    """The live replicas of a node being deleted (inside its transaction); returns how many changed.

    With a tunnel open the agent is told to stop what it started before it exits (revocation): the replicas
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
    endpoints = _lock_endpoints_on(node, EndpointStatus.live())
    changed = EndpointReplica.objects.filter(node=node, status__in=EndpointStatus.live()).update(
        status=status, failure_code=code, failure_message=message, updated_at=timezone.now()
    )
    for endpoint in endpoints:
        endpoint_summarise(endpoint)
    return changed


def _fail_unresponsive(node: Node, endpoint: Endpoint, replica: EndpointReplica) -> None:
    """The agent's health probes of `replica`'s server failed: it fails (out of rotation; the healing pass
    replaces it, `endpoint_heal.replica_lost`) and its hung server is told to stop, the replica staying failed.
    The caller saves the replica."""
    replica.status = EndpointStatus.FAILED
    replica.failure_code = UNRESPONSIVE
    replica.failure_message = (
        f"The server on node {node.name} (port {replica.port or '?'}) stopped answering its health checks "
        "(GET /health): it was taken out of rotation and told to stop, and a replacement is started."
    )
    try:
        actor = system_actor(endpoint.cluster.workspace)
    except PermissionDenied:  # no Owner/Admin to send the stop as: the server stays until someone stops it
        actor = None
    command = None
    if actor is not None:
        (command,) = command_queue(
            actor=actor,
            cluster=endpoint.cluster,
            command_type=CommandType.ENDPOINT_STOP,
            payload={"endpoint_id": replica.server_id},
            node=node,
        )
        replica.stop_command = command
    endpoint_event_record(
        endpoint=endpoint,
        node_id=node.pk,
        kind="endpoint.unresponsive",
        message=f"Endpoint {endpoint.hostname}, replica {replica.server_id}: "
        f"{error_sentence(UNRESPONSIVE, replica.failure_message)}",
        data={"replica": replica.server_id, "error_help": error_help(UNRESPONSIVE)},
        command=command,
    )


def endpoints_reconcile(*, node: Node, inventory: protocol.Inventory) -> int:
    """Running replicas the agent reports update their rows (port, status); running rows it no longer
    reports become failed (the process is gone), and so do those it reports `unresponsive` (the server
    hangs: failure code "unresponsive", its server told to stop). Returns how many replica rows changed."""
    reported = {e.endpoint_id: e for e in inventory.endpoints}
    changed = 0
    live = [EndpointStatus.STARTING, EndpointStatus.RUNNING, EndpointStatus.PENDING]
    with transaction.atomic():
        endpoints = {e.pk: e for e in _lock_endpoints_on(node, live)}
        touched = set()
        for replica in EndpointReplica.objects.select_for_update().filter(node=node, status__in=live):
            info = reported.get(replica.server_id)
            if info is None:
                if replica.status != EndpointStatus.RUNNING:
                    continue  # start still in flight
                replica.status = EndpointStatus.FAILED
                replica.failure_code = "not_found"
                replica.failure_message = "The node no longer runs this endpoint (agent or node restarted?)."
                endpoint_event_record(
                    endpoint=endpoints[replica.endpoint_id],
                    node_id=node.pk,
                    kind="endpoint.failed",
                    message=f"Endpoint {endpoints[replica.endpoint_id].hostname}: replica {replica.server_id} is gone "
                    f"from node {node.name}",
                )
            elif info.status == "running" and _valid_port(info.port):
                if replica.status == EndpointStatus.RUNNING and replica.port == info.port:
                    continue
                replica.status, replica.port = EndpointStatus.RUNNING, info.port
            elif info.status == UNRESPONSIVE:
                _fail_unresponsive(node, endpoints[replica.endpoint_id], replica)
            elif info.status in ("stopped", "failed"):
                replica.status = EndpointStatus(info.status)
            else:
                continue
            replica.save()
            touched.add(replica.endpoint_id)
            changed += 1
        for endpoint_id in touched:
            endpoint_summarise(endpoints[endpoint_id])
    return changed

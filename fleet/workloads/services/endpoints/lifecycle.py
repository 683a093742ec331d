"""An endpoint's life as its workspace drives it (Owner, Admin, Member): create (placed and started), stop, restart.

An endpoint keeps `min_replicas` replicas (`EndpointReplica`), each one server on a node; its own status
summarises theirs (`replicas.endpoint_summarise`). Lock order: the endpoint's row, then its replicas'.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction

from audit.services import created, new, on, operator_action
from fleet.models import Command, ComputeCluster, Node
from fleet.workloads.models import Endpoint, EndpointStatus, RoutingPolicy
from fleet.workloads.services.endpoints.admission import validate_admission
from fleet.workloads.services.endpoints.events import endpoint_event_record
from fleet.workloads.services.endpoints.groups import group_start, validate_distributed, validate_parallel
from fleet.workloads.services.endpoints.placement import place_replicas
from fleet.workloads.services.endpoints.replicas import GROUP_STOPPED, endpoint_summarise, replica_queue_stop
from fleet.workloads.services.endpoints.validation import (
    MAX_GPUS,
    MAX_IDLE_TIMEOUT_S,
    MAX_REPLICAS,
    MAX_SCALE_COOLDOWN_S,
    MAX_TARGET_IN_FLIGHT,
    MAX_TARGET_REQUESTS_PER_MIN,
    MAX_TARGET_TOKENS_PER_S,
    MAX_VRAM_MB,
    validate_count,
    validate_model_id,
    validate_revision,
    validate_routing_policy,
    validate_server_args,
)
from kernel.exceptions import IllegalTransition
from tenancy.mixins import require_editor
from tenancy.quotas import admit, locked_quota


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
    routing_policy: str = RoutingPolicy.LEAST_LOAD,
    target_queued: int = 0,
    max_concurrency: int | None = None,
    queue_max_depth: int | None = None,
    queue_max_wait_s: int | None = None,
    ray_cluster: Any = None,
    pipeline_parallel: int = 1,
    tensor_parallel: int = 1,
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
    (`validate_server_args`). The proxy spreads requests over the replicas by `routing_policy`, at most
    `max_concurrency` in flight per replica, the rest waiting in a queue (`queue_max_depth`, `queue_max_wait_s`;
    None: the defaults, `fleet.admission`); `target_queued` (per replica; 0 = off) scales on that queue.

    With `ray_cluster` (a running managed Ray cluster of the workspace, instead of a node) the endpoint is
    distributed: one vLLM group of `pipeline_parallel` stages, one per Ray node, `tensor_parallel` GPUs within
    each (`services.endpoints.groups`: checked and admitted as one unit before anything starts).
    """
    require_editor(actor, cluster.workspace, what="create endpoints")
    validate_model_id(model_id)
    validate_revision(revision)
    server_args = validate_server_args([] if server_args is None else server_args)
    validate_count(gpus, "gpus", MAX_GPUS)
    validate_count(min_vram_mb, "min_vram_mb", MAX_VRAM_MB)
    if not isinstance(public, bool):
        raise ValidationError({"public": "Must be a boolean."})
    if node is not None and node.cluster_id != cluster.pk:
        raise ValidationError({"node": "This node is not in this cluster."})
    validate_count(min_replicas, "min_replicas", MAX_REPLICAS)
    max_replicas = max(min_replicas, 1) if max_replicas is None else max_replicas
    validate_count(max_replicas, "max_replicas", MAX_REPLICAS)
    if max_replicas < max(min_replicas, 1):
        raise ValidationError({"max_replicas": "Must be at least min_replicas, and at least 1."})
    validate_count(idle_timeout_s, "idle_timeout_s", MAX_IDLE_TIMEOUT_S)
    if min_replicas == 0 and idle_timeout_s < 1:
        raise ValidationError(
            {"idle_timeout_s": "An endpoint that scales to zero (min_replicas 0) needs an idle timeout of 1 s or more."}
        )
    validate_count(target_requests_per_min, "target_requests_per_min", MAX_TARGET_REQUESTS_PER_MIN)
    validate_count(target_in_flight, "target_in_flight", MAX_TARGET_IN_FLIGHT)
    validate_count(target_tokens_per_s, "target_tokens_per_s", MAX_TARGET_TOKENS_PER_S)
    validate_count(scale_cooldown_s, "scale_cooldown_s", MAX_SCALE_COOLDOWN_S)
    validate_routing_policy(routing_policy)
    validate_count(target_queued, "target_queued", MAX_TARGET_IN_FLIGHT)
    admission = {
        name: validate_admission(name, value)
        for name, value in (
            ("max_concurrency", max_concurrency),
            ("queue_max_depth", queue_max_depth),
            ("queue_max_wait_s", queue_max_wait_s),
        )
    }
    if node is not None and min_replicas > 1:
        raise ValidationError({"node": "A chosen node takes one replica: leave it out to place several."})
    validate_parallel(pipeline_parallel, "pipeline_parallel")
    validate_parallel(tensor_parallel, "tensor_parallel")
    if ray_cluster is not None:
        validate_distributed(
            node=node,
            replicas=(min_replicas, max_replicas),
            autoscaled=any((target_requests_per_min, target_in_flight, target_tokens_per_s, target_queued)),
            pipeline_parallel=pipeline_parallel,
        )
    elif pipeline_parallel > 1 or tensor_parallel > 1:
        field = "pipeline_parallel" if pipeline_parallel > 1 else "tensor_parallel"
        raise ValidationError(
            {field: "Only an endpoint on a Ray cluster (ray_cluster) spans nodes; on one node use gpus."}
        )
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
            routing_policy=routing_policy,
            target_queued=target_queued,
            **admission,
            ray_cluster_id=None if ray_cluster is None else ray_cluster.pk,
            pipeline_parallel=pipeline_parallel,
            tensor_parallel=tensor_parallel,
            created_by=actor,
        )
        if endpoint.distributed:
            commands = group_start(actor=actor, endpoint=endpoint)
        else:
            commands = place_replicas(actor=actor, endpoint=endpoint, node=node)
        endpoint.start_command = commands[0]
        endpoint.save(update_fields=["start_command", "updated_at"])
        endpoint = endpoint_summarise(endpoint)
        # placement takes only nodes holding the weights (`pick_endpoint_node`): each event says where and why
        names = dict(Node.objects.filter(pk__in=[c.node_id for c in commands]).values_list("pk", "name"))
        for command in commands:
            endpoint_event_record(
                endpoint=endpoint,
                node_id=command.node_id,
                kind="endpoint.starting",
                message=f"Endpoint {endpoint.hostname} for {model_id}@{revision} requested by {actor.get_username()}; "
                f"{_rank_words(endpoint, command)}placed on node {names.get(command.node_id, '?')}, which holds the "
                "weights in its model cache",
                command=command,
            )
    return endpoint


def _rank_words(endpoint: Endpoint, command: Command) -> str:
    """The words "rank 1 (follower) " for a distributed endpoint's start command, else ""."""
    rank = endpoint.replicas.filter(start_command=command).values_list("group_rank", flat=True).first()
    return "" if rank is None else f"rank {rank} ({'leader' if rank == 0 else 'follower'}) "


@operator_action("endpoint.stop", target=on("endpoint", "endpoint"))
def endpoint_stop(*, actor: AbstractBaseUser, endpoint: Endpoint) -> Endpoint:
    """Stop an endpoint (→ stopping; → stopped when the agent confirms), or one scaled to zero (→ stopped: no
    request wakes it any more), or a distributed one down and waiting to start again (failed, or stopping while a
    rank's stop waits on its offline node: it is not started again). Owner, Admin or Member; 409 otherwise if not
    live or idle."""
    require_editor(actor, endpoint.cluster.workspace, what="stop endpoints")
    with transaction.atomic():
        endpoint = (
            Endpoint.objects.select_for_update(of=("self",)).select_related("node", "cluster").get(pk=endpoint.pk)
        )
        # a group down and waiting to start again (stopping too while a rank's stop waits on its offline node)
        down = endpoint.group_failure_code not in ("", GROUP_STOPPED)
        waiting = endpoint.distributed and down and endpoint.status in (EndpointStatus.FAILED, EndpointStatus.STOPPING)
        if not waiting and (endpoint.status not in EndpointStatus.kept() or endpoint.status == EndpointStatus.STOPPING):
            raise IllegalTransition(f"This endpoint is {endpoint.status}; only a running or starting one can stop.")
        if endpoint.distributed:  # the group as one: stopped, it is not healed (a failed one waiting neither)
            endpoint.group_failure_code = GROUP_STOPPED
            endpoint.group_failure = f"stopped by {actor.get_username()}"
            endpoint.save(update_fields=["group_failure_code", "group_failure", "updated_at"])
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
        if endpoint.distributed:
            commands = group_start(actor=actor, endpoint=endpoint)
        else:
            commands = place_replicas(actor=actor, endpoint=endpoint)
        endpoint.start_command = commands[0]
        endpoint.save(update_fields=["start_command", "updated_at"])
        endpoint_summarise(endpoint)
    endpoint.refresh_from_db()
    return endpoint

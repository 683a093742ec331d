"""Writes for managed Ray clusters. Keyword-only, one transaction each, commands leave on commit.

State machine (owned by `ray_cluster_transition`, the only writer of `RayCluster.status`):

    pending  → running | failed | stopped | deleting
    running  → failed | stopped | deleting
    failed   → pending (start) | stopped | deleting
    stopped  → pending (start) | deleting
    deleting → (row deleted once every Ray node is stopped)

Everything that touches a machine is a fleet `Command` dispatched with `fleet.services.command_queue`
(`ray.head.start`, `ray.worker.start`, `ray.node.drain`, `ray.node.stop`, `ray.status`); results come
back through `ray_on_command_finished`, connected to `fleet.signals.command_finished`.

On `kubernetes` and `argocd` compute clusters a Ray cluster is one KubeRay ``RayCluster`` (runtime
``kuberay``): the head's RayNode stands for the whole resource and sits on the agent node that applies
it; KubeRay's in-tree autoscaler runs the worker group (min/max workers, idle timeout), so the control
plane starts no workers and only asks for status. Stop suspends the RayCluster (``spec.suspend``: the
pods go, the resource, its name and head Service stay, as "stopped: state preserved" promises), start
resumes it, delete deletes it (argocd: the same as commits).
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections import Counter
from typing import Any

import django.dispatch
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from cleverthis.audit.services import created, new, on, operator_action
from cleverthis.tenancy.models import Membership, Role, Workspace
from cleverthis.tenancy.permissions import can_operate
from fleet import services as fleet_services
from fleet.models import Command, CommandStatus, ComputeCluster, Mode, Node
from kernel import metrics
from kernel.exceptions import IllegalTransition
from raymgr import autoscaler
from raymgr.failures import failure_text
from raymgr.models import (
    RayCluster,
    RayClusterEvent,
    RayClusterStatus,
    RayNode,
    RayNodeRole,
    RayNodeStatus,
    RayRuntime,
)
from raymgr.placement import PlacementError, choose_head_node, choose_worker_node
from raymgr.versions import default_version, version_error

logger = logging.getLogger(__name__)

S = RayClusterStatus
TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.RUNNING, S.FAILED, S.STOPPED, S.DELETING}),
    S.RUNNING: frozenset({S.FAILED, S.STOPPED, S.DELETING}),
    S.FAILED: frozenset({S.PENDING, S.STOPPED, S.DELETING}),
    S.STOPPED: frozenset({S.PENDING, S.DELETING}),
    S.DELETING: frozenset(),
}
# Heads of clusters in these states hold their ports on their node.
PORT_HOLDING = (S.PENDING, S.RUNNING)
# A deleting cluster whose stop commands never finish (node gone for good) is removed after this.
DELETE_GRACE = dt.timedelta(minutes=10)
# The autoscaler decides on a stored status only if it is at most this old.
STATUS_MAX_AGE = dt.timedelta(minutes=2)
STATUS_LOG_LINES = 100
UPDATABLE = ("min_workers", "max_workers", "idle_timeout_s", "ray_version", "checkpoint_on_stop")
# Compute-cluster modes whose Ray clusters are KubeRay RayClusters.
KUBE_MODES = (Mode.KUBERNETES, Mode.ARGOCD)

# Sent with `ray_cluster=<RayCluster>` just before its Ray nodes are stopped, so the jobs/experiments
# app can checkpoint them first when `ray_cluster.checkpoint_on_stop` is set.
ray_cluster_stopping = django.dispatch.Signal()


def _require_operator(actor: Any, workspace: Workspace) -> None:
    if not can_operate(actor, workspace):
        raise PermissionDenied("Only workspace Owners and Admins can manage Ray clusters.")


def _event(cluster: RayCluster | uuid.UUID, kind: str, message: str, **data: Any) -> RayClusterEvent:
    cluster_id = cluster.pk if isinstance(cluster, RayCluster) else cluster
    return RayClusterEvent.objects.create(ray_cluster_id=cluster_id, kind=kind, message=message, data=data)


# --------------------------------------------------------------------------------------------------
# State machine


def ray_cluster_transition(*, cluster: RayCluster, to: str, reason: str = "", **fields: Any) -> RayCluster:
    """Move `cluster` to `to` with a conditional UPDATE; `IllegalTransition` (HTTP 409) if not allowed.

    Stamps `status_changed_at`, stores `reason` as the failure reason when failing (clears it otherwise),
    records a `status` event and refreshes `cluster`.
    """
    if to not in TRANSITIONS:
        raise ValueError(f"unknown Ray cluster status {to!r}")
    allowed_from = [state for state, targets in TRANSITIONS.items() if to in targets]
    fields["failure_reason"] = reason if to == S.FAILED else ""
    updated = RayCluster.objects.filter(pk=cluster.pk, status__in=allowed_from).update(
        status=to, status_changed_at=timezone.now(), **fields
    )
    if updated != 1:
        current = RayCluster.objects.filter(pk=cluster.pk).values_list("status", flat=True).first()
        if current is None:
            raise IllegalTransition("This Ray cluster no longer exists.")
        raise IllegalTransition(f"A {current} Ray cluster cannot become {to}.")
    _event(cluster, "status", f"Status → {to}" + (f": {reason}" if reason else ""), status=to)
    cluster.refresh_from_db()
    return cluster


def _ray_node_status(ray_node: RayNode, to: str, **fields: Any) -> None:
    RayNode.objects.filter(pk=ray_node.pk).update(status=to, status_changed_at=timezone.now(), **fields)
    ray_node.status = to
    for name, value in fields.items():
        setattr(ray_node, name, value)


# --------------------------------------------------------------------------------------------------
# Create / update / start / stop / delete


def _validate_bounds(min_workers: Any, max_workers: Any, idle_timeout_s: Any) -> dict[str, str]:
    errors: dict[str, str] = {}
    for name, value, low in (("min_workers", min_workers, 0), ("max_workers", max_workers, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 1000:
            errors[name] = "A whole number from 0 to 1000."
    if isinstance(idle_timeout_s, bool) or not isinstance(idle_timeout_s, int) or not 1 <= idle_timeout_s <= 86400:
        errors["idle_timeout_s"] = "A whole number of seconds from 1 to 86400."
    if not errors and max_workers < min_workers:
        errors["max_workers"] = "Must be at least min_workers."
    return errors


def _validate_workers(worker_cpus: Any, worker_memory_mb: Any, worker_gpus: Any) -> dict[str, str]:
    errors: dict[str, str] = {}
    if isinstance(worker_cpus, bool) or not isinstance(worker_cpus, int | float) or not 0.1 <= worker_cpus <= 1024:
        errors["worker_cpus"] = "A number of CPUs from 0.1 to 1024."
    if isinstance(worker_memory_mb, bool) or not isinstance(worker_memory_mb, int):
        errors["worker_memory_mb"] = "A whole number of MB from 256 to 4194304."
    elif not 256 <= worker_memory_mb <= 4 * 1024 * 1024:
        errors["worker_memory_mb"] = "A whole number of MB from 256 to 4194304."
    if isinstance(worker_gpus, bool) or not isinstance(worker_gpus, int) or not 0 <= worker_gpus <= 64:
        errors["worker_gpus"] = "A whole number of GPUs from 0 to 64."
    return errors


def runtime_for(compute_cluster: ComputeCluster, requested: str) -> str:
    """The runtime a new Ray cluster gets: always kuberay on kubernetes/argocd compute clusters."""
    return RayRuntime.KUBERAY if compute_cluster.mode in KUBE_MODES else requested


@operator_action(
    "ray_cluster.create",
    target=new("ray_cluster"),
    result=created("ray_cluster"),
    detail=lambda kw, _: {
        "compute_cluster": kw["compute_cluster"].name,
        "runtime": str(kw.get("runtime", RayRuntime.DOCKER)),
    },
)
def ray_cluster_create(
    *,
    actor: AbstractBaseUser,
    workspace: Workspace,
    compute_cluster: ComputeCluster,
    name: str,
    ray_version: str | None = None,
    runtime: str = RayRuntime.DOCKER,
    min_workers: int = 0,
    max_workers: int = 10,
    idle_timeout_s: int = 60,
    gcs_port: int = 6379,
    dashboard_port: int = 8265,
    checkpoint_on_stop: bool = False,
    worker_cpus: float = 1.0,
    worker_memory_mb: int = 2048,
    worker_gpus: int = 0,
) -> RayCluster:
    """Create a Ray cluster (Owner/Admin only) and place its head; it starts `pending`.

    On kubernetes/argocd compute clusters the runtime is always kuberay (a KubeRay RayCluster whose
    worker pods request `worker_cpus`, `worker_memory_mb` and `worker_gpus`); kuberay is refused
    elsewhere. `ray_version` must be one the runtime offers (`raymgr.versions`); None picks the runtime's
    default. Placement failures do not raise: the cluster is created `failed` with the reason recorded.
    """
    _require_operator(actor, workspace)
    errors = _validate_bounds(min_workers, max_workers, idle_timeout_s)
    errors.update(_validate_workers(worker_cpus, worker_memory_mb, worker_gpus))
    if compute_cluster.workspace_id != workspace.pk:
        errors["compute_cluster"] = "No such compute cluster in this workspace."
    runtime = runtime_for(compute_cluster, runtime)
    if runtime not in RayRuntime.values:
        errors["runtime"] = f"Choose one of {', '.join(RayRuntime.values)}."
    elif runtime == RayRuntime.KUBERAY and compute_cluster.mode not in KUBE_MODES:
        errors["runtime"] = "KubeRay runs on kubernetes and argocd compute clusters; this one is standalone."
    elif ray_version is None:
        ray_version = default_version(runtime)
    elif version_error(runtime, ray_version):
        errors["ray_version"] = version_error(runtime, ray_version)
    if gcs_port == dashboard_port:
        errors["dashboard_port"] = "Must differ from the GCS port."
    if runtime == RayRuntime.PROCESS and gcs_port == 6379:
        errors["gcs_port"] = "The process runtime cannot use 6379 (Redis's port on shared machines); choose another."
    if errors:
        raise ValidationError(errors)
    cluster = RayCluster(
        workspace=workspace,
        compute_cluster=compute_cluster,
        name=name.strip() if isinstance(name, str) else name,
        ray_version=ray_version,
        runtime=runtime,
        min_workers=min_workers,
        max_workers=max_workers,
        idle_timeout_s=idle_timeout_s,
        gcs_port=gcs_port,
        dashboard_port=dashboard_port,
        checkpoint_on_stop=checkpoint_on_stop,
        worker_cpus=worker_cpus,
        worker_memory_mb=worker_memory_mb,
        worker_gpus=worker_gpus,
        created_by=actor,
    )
    cluster.full_clean(exclude=["workspace", "compute_cluster", "created_by"], validate_constraints=False)
    try:
        with transaction.atomic():
            cluster.save(force_insert=True)
    except IntegrityError:
        raise ValidationError({"name": "A Ray cluster with this name already exists in the workspace."}) from None
    _event(cluster, "created", f"Created by {actor.get_username()} (Ray {cluster.ray_version}, {cluster.runtime})")
    _launch_head(cluster, actor)
    cluster.refresh_from_db()
    return cluster


@operator_action(
    "ray_cluster.update",
    target=on("cluster", "ray_cluster"),
    detail=lambda kw, _: {"fields": sorted(set(kw) - {"actor", "cluster"})},
)
def ray_cluster_update(*, actor: AbstractBaseUser, cluster: RayCluster, **fields: Any) -> RayCluster:
    """Change scaling bounds, idle timeout, checkpointing or (only when stopped/failed) the Ray version."""
    _require_operator(actor, cluster.workspace)
    unknown = sorted(set(fields) - set(UPDATABLE))
    if unknown:
        raise ValidationError({name: "This field cannot be changed." for name in unknown})
    cluster = RayCluster.objects.select_for_update().get(pk=cluster.pk)
    if "ray_version" in fields and fields["ray_version"] != cluster.ray_version:
        if cluster.status not in (S.STOPPED, S.FAILED):
            raise ValidationError(
                {
                    "ray_version": f"The Ray version cannot change while the cluster is {cluster.status}: "
                    f"it runs Ray {cluster.ray_version}. Stop the cluster first, then change the version."
                }
            )
        if version_error(cluster.runtime, fields["ray_version"]):
            raise ValidationError({"ray_version": version_error(cluster.runtime, fields["ray_version"])})
    for name, value in fields.items():
        setattr(cluster, name, value)
    errors = _validate_bounds(cluster.min_workers, cluster.max_workers, cluster.idle_timeout_s)
    if errors:
        raise ValidationError(errors)
    cluster.full_clean(exclude=["workspace", "compute_cluster", "created_by"], validate_constraints=False)
    cluster.save(update_fields=list(fields))
    if fields:
        _event(cluster, "updated", "Settings changed: " + ", ".join(f"{k}={v}" for k, v in sorted(fields.items())))
    return cluster


@operator_action("ray_cluster.start", target=on("cluster", "ray_cluster"))
def ray_cluster_start(*, actor: AbstractBaseUser, cluster: RayCluster) -> RayCluster:
    """stopped/failed → pending: place the head again; workers follow up to min_workers once it runs."""
    _require_operator(actor, cluster.workspace)
    cluster = ray_cluster_transition(
        cluster=cluster, to=S.PENDING, head_node=None, head_ip="", head_hostname="", head_container_id=""
    )
    _stop_all(cluster, actor, why="left over from before the restart")
    _launch_head(cluster, actor)
    cluster.refresh_from_db()
    return cluster


@operator_action("ray_cluster.stop", target=on("cluster", "ray_cluster"))
def ray_cluster_stop(*, actor: AbstractBaseUser, cluster: RayCluster) -> RayCluster:
    """→ stopped: every Ray node is stopped (running jobs are interrupted; checkpointed first when enabled)."""
    _require_operator(actor, cluster.workspace)
    ray_cluster_stopping.send(sender=RayCluster, ray_cluster=cluster)
    cluster = ray_cluster_transition(cluster=cluster, to=S.STOPPED, started_at=None)
    _stop_all(cluster, actor, why="cluster stopped")
    return cluster


@operator_action("ray_cluster.delete", target=on("cluster", "ray_cluster"))
def ray_cluster_delete(*, actor: AbstractBaseUser, cluster: RayCluster) -> RayCluster | None:
    """→ deleting: stop every Ray node; the row (and what references it) goes once they are stopped.

    Returns None when the cluster was deleted at once (no Ray node was live).
    """
    _require_operator(actor, cluster.workspace)
    if cluster.status in (S.PENDING, S.RUNNING):
        ray_cluster_stopping.send(sender=RayCluster, ray_cluster=cluster)
    cluster = ray_cluster_transition(cluster=cluster, to=S.DELETING)
    _stop_all(cluster, actor, why="cluster deleted")
    return _finish_delete_if_done(cluster)


def _finish_delete_if_done(cluster: RayCluster, *, force: bool = False) -> RayCluster | None:
    if cluster.status != S.DELETING:
        return cluster
    if not force and cluster.ray_nodes.filter(status__in=RayNodeStatus.live()).exists():
        return cluster
    logger.info("Ray cluster %s deleted", cluster.pk)
    RayCluster.objects.filter(pk=cluster.pk, status=S.DELETING).delete()
    return None


# --------------------------------------------------------------------------------------------------
# Placement and commands


def _operator_for(cluster: RayCluster) -> AbstractBaseUser | None:
    """Whom automatic commands (autoscaler, follow-ups) run as: the creator, else an Owner/Admin."""
    if cluster.created_by is not None and can_operate(cluster.created_by, cluster.workspace):
        return cluster.created_by
    membership = (
        Membership.objects.filter(workspace_id=cluster.workspace_id, role__in=list(Role.operators()))
        .select_related("user")
        .order_by("-role", "created_at")
        .first()
    )
    return membership.user if membership else None


def _ports_in_use(cluster: RayCluster) -> dict[Any, set[int]]:
    rows = (
        RayNode.objects.filter(
            role=RayNodeRole.HEAD,
            status__in=RayNodeStatus.live(),
            ray_cluster__status__in=PORT_HOLDING,
            node__cluster_id=cluster.compute_cluster_id,
        )
        .exclude(ray_cluster=cluster)
        .values_list("node_id", "ray_cluster__gcs_port", "ray_cluster__dashboard_port")
    )
    used: dict[Any, set[int]] = {}
    for node_id, gcs, dashboard in rows:
        used.setdefault(node_id, set()).update({gcs, dashboard})
    return used


def _dispatch(actor: Any, node: Node, command_type: str, payload: dict[str, Any]) -> Command:
    (command,) = fleet_services.command_queue(
        actor=actor, cluster=node.cluster, command_type=command_type, payload=payload, node=node
    )
    return command


def _launch_kuberay(cluster: RayCluster, actor: Any) -> None:
    """Apply (or resume) the cluster's RayCluster through one online agent of the compute cluster."""
    nodes = sorted(
        Node.objects.filter(cluster_id=cluster.compute_cluster_id, status="online").select_related("cluster"),
        key=lambda n: n.name,
    )
    if not nodes:
        message = "No nodes online in the compute cluster: no agent can apply the RayCluster."
        _event(cluster, "placement_failed", message, code="no_nodes_online")
        ray_cluster_transition(cluster=cluster, to=S.FAILED, reason=message)
        return
    node = nodes[0]
    head = RayNode.objects.create(ray_cluster=cluster, node=node, role=RayNodeRole.HEAD)
    payload = {
        "cluster_id": str(cluster.pk),
        "member_id": str(head.pk),
        "ray_version": cluster.ray_version,
        "image": cluster.image(),
        "runtime": RayRuntime.KUBERAY,
        "gcs_port": cluster.gcs_port,
        "dashboard_port": cluster.dashboard_port,
        "name": cluster.kuberay_name,
        "min_workers": cluster.min_workers,
        "max_workers": cluster.max_workers,
        "idle_timeout_s": cluster.idle_timeout_s,
        "worker_cpus": cluster.worker_cpus,
        "worker_memory_mb": cluster.worker_memory_mb,
        "worker_gpus": cluster.worker_gpus,
        "worker_image": cluster.image(gpu=cluster.worker_gpus > 0),
    }
    try:
        command = _dispatch(actor, node, "ray.head.start", payload)
    except IllegalTransition as exc:
        _ray_node_status(head, RayNodeStatus.FAILED, failure_reason=str(exc))
        ray_cluster_transition(cluster=cluster, to=S.FAILED, reason=f"{node.name} cannot apply the RayCluster: {exc}")
        return
    RayNode.objects.filter(pk=head.pk).update(start_command=command)
    RayCluster.objects.filter(pk=cluster.pk).update(head_node=node)
    where = "commits it for ArgoCD" if cluster.compute_cluster.mode == Mode.ARGOCD else "applies it"
    _event(
        cluster,
        "placement",
        f"RayCluster {cluster.kuberay_name}: {node.name} {where}",
        node_id=str(node.pk),
        command_id=str(command.pk),
    )


def _launch_head(cluster: RayCluster, actor: Any) -> None:
    if cluster.is_kuberay:
        _launch_kuberay(cluster, actor)
        return
    nodes = list(Node.objects.filter(cluster_id=cluster.compute_cluster_id).select_related("cluster"))
    try:
        node = choose_head_node(
            nodes,
            ports_in_use=_ports_in_use(cluster),
            gcs_port=cluster.gcs_port,
            dashboard_port=cluster.dashboard_port,
        )
    except PlacementError as exc:
        _event(cluster, "placement_failed", exc.message, code=exc.code)
        ray_cluster_transition(cluster=cluster, to=S.FAILED, reason=exc.message)
        return
    head = RayNode.objects.create(ray_cluster=cluster, node=node, role=RayNodeRole.HEAD)
    payload = {
        "cluster_id": str(cluster.pk),
        "member_id": str(head.pk),
        "ray_version": cluster.ray_version,
        "image": cluster.image_for(node),
        "runtime": cluster.runtime,
        "gcs_port": cluster.gcs_port,
        "dashboard_port": cluster.dashboard_port,
        "num_gpus": node.gpu_count if cluster.runtime == RayRuntime.DOCKER else 0,
    }
    try:
        command = _dispatch(actor, node, "ray.head.start", payload)
    except IllegalTransition as exc:
        _ray_node_status(head, RayNodeStatus.FAILED, failure_reason=str(exc))
        ray_cluster_transition(cluster=cluster, to=S.FAILED, reason=f"The head cannot start on {node.name}: {exc}")
        return
    RayNode.objects.filter(pk=head.pk).update(start_command=command)
    RayCluster.objects.filter(pk=cluster.pk).update(head_node=node, head_hostname=node.hostname)
    _event(
        cluster,
        "placement",
        f"Head placed on {node.name} ({max(0, node.memory_total_mb - node.memory_used_mb)} MB free RAM)",
        node_id=str(node.pk),
        command_id=str(command.pk),
    )


def _head(cluster: RayCluster) -> RayNode | None:
    return cluster.ray_nodes.filter(role=RayNodeRole.HEAD, status=RayNodeStatus.RUNNING).select_related("node").first()


def _worker_candidates(cluster: RayCluster) -> tuple[list[Node], Counter]:
    nodes = list(Node.objects.filter(cluster_id=cluster.compute_cluster_id).select_related("cluster"))
    occupied = Counter(cluster.ray_nodes.filter(status__in=RayNodeStatus.live()).values_list("node_id", flat=True))
    return nodes, occupied


def _next_worker_node(cluster: RayCluster, nodes: list[Node], occupied: Counter) -> Node | None:
    node = choose_worker_node(
        nodes,
        head_node_id=cluster.head_node_id,
        ray_nodes_per_node=occupied,
        share_nodes=cluster.runtime == RayRuntime.PROCESS,
    )
    return node  # type: ignore[return-value]


def _start_workers(cluster: RayCluster, actor: Any, count: int, *, why: str) -> list[RayNode]:
    """Place and start `count` workers (fewer, with an event, when nodes run out)."""
    if count <= 0 or not cluster.gcs_address:
        return []
    nodes, occupied = _worker_candidates(cluster)
    started: list[RayNode] = []
    for _ in range(count):
        node = _next_worker_node(cluster, nodes, occupied)
        if node is None:
            _event(
                cluster,
                "placement_failed",
                f"No node can take another worker ({len(started)} of {count} started): every other online node "
                "already runs one.",
                wanted=count,
                started=len(started),
            )
            break
        worker = RayNode.objects.create(ray_cluster=cluster, node=node, role=RayNodeRole.WORKER)
        payload = {
            "cluster_id": str(cluster.pk),
            "member_id": str(worker.pk),
            "ray_version": cluster.ray_version,
            "image": cluster.image_for(node),
            "runtime": cluster.runtime,
            "head_address": cluster.gcs_address,
            "num_gpus": node.gpu_count if cluster.runtime == RayRuntime.DOCKER else 0,
        }
        try:
            command = _dispatch(actor, node, "ray.worker.start", payload)
        except IllegalTransition as exc:
            _ray_node_status(worker, RayNodeStatus.FAILED, failure_reason=str(exc))
            occupied[node.pk] += 1
            continue
        RayNode.objects.filter(pk=worker.pk).update(start_command=command)
        occupied[node.pk] += 1
        started.append(worker)
        _event(cluster, "worker_starting", f"Starting a worker on {node.name} ({why})", node_id=str(node.pk))
    return started


def _stop_ray_node(cluster: RayCluster, ray_node: RayNode, actor: Any) -> None:
    payload = {
        "cluster_id": str(cluster.pk),
        "member_id": str(ray_node.pk),
        "runtime": cluster.runtime,
        "container": ray_node.container_id,
    }
    if cluster.is_kuberay and cluster.status == S.DELETING:
        payload["delete"] = True  # otherwise the RayCluster is suspended
    try:
        command = _dispatch(actor, ray_node.node, "ray.node.stop", payload)
    except IllegalTransition as exc:
        _ray_node_status(ray_node, RayNodeStatus.STOPPED, failure_reason=str(exc), pending_command=None)
        return
    _ray_node_status(ray_node, RayNodeStatus.STOPPING, pending_command=command)


def _stop_all(cluster: RayCluster, actor: Any, *, why: str) -> None:
    ray_nodes = list(cluster.ray_nodes.filter(status__in=RayNodeStatus.live()).select_related("node__cluster"))
    for ray_node in ray_nodes:
        _stop_ray_node(cluster, ray_node, actor)
    if ray_nodes:
        _event(cluster, "stopping", f"Stopping {len(ray_nodes)} Ray node(s): {why}")


def _drain_worker(cluster: RayCluster, worker: RayNode, head: RayNode | None, actor: Any, *, why: str) -> None:
    """Ray-drain `worker` through the head; its container is stopped once the drain finished."""
    if head is None or not worker.ray_node_id:
        _stop_ray_node(cluster, worker, actor)
        return
    payload = {
        "cluster_id": str(cluster.pk),
        "member_id": str(worker.pk),
        "ray_node_id": worker.ray_node_id,
        "runtime": cluster.runtime,
        "head_member_id": str(head.pk),
        "gcs_port": cluster.gcs_port,
        "reason": why[:200],
    }
    try:
        command = _dispatch(actor, head.node, "ray.node.drain", payload)
    except IllegalTransition:
        _stop_ray_node(cluster, worker, actor)
        return
    _ray_node_status(worker, RayNodeStatus.DRAINING, pending_command=command)


# --------------------------------------------------------------------------------------------------
# Command results


def ray_on_command_finished(*, command: Command, **_: Any) -> None:
    """Advance Ray state from a finished `ray.*` command (receiver of `fleet.signals.command_finished`).

    Idempotent: a result is applied only while the Ray node still waits for that very command.
    """
    if not command.command_type.startswith("ray.") or command.status not in CommandStatus.terminal():
        return
    cluster_id = command.payload.get("cluster_id")
    member_id = command.payload.get("member_id")
    try:
        cluster_uuid, member_uuid = uuid.UUID(str(cluster_id)), uuid.UUID(str(member_id))
    except ValueError:
        return
    with transaction.atomic():
        cluster = RayCluster.objects.select_for_update().filter(pk=cluster_uuid).first()
        if cluster is None:
            return
        ray_node = RayNode.objects.select_for_update().select_related("node__cluster").filter(pk=member_uuid).first()
        if ray_node is None or ray_node.ray_cluster_id != cluster.pk:
            return
        ok = command.status == CommandStatus.SUCCEEDED
        handler = _RESULT_HANDLERS.get(command.command_type)
        if handler is not None:
            handler(cluster, ray_node, command, ok)


def _error_text(command: Command) -> str:
    return failure_text(command.error_code, command.error_message)


def _on_start(cluster: RayCluster, ray_node: RayNode, command: Command, ok: bool) -> None:
    if ray_node.start_command_id != command.pk:
        return
    if ray_node.status != RayNodeStatus.STARTING:
        if ok and ray_node.status in (RayNodeStatus.STOPPING, RayNodeStatus.STOPPED):
            # Stopped while it was starting: the earlier stop may have run first, so stop it again.
            actor = _operator_for(cluster)
            if actor is not None:
                ray_node.container_id = str((command.result or {}).get("container_id", ""))[:128]
                _stop_ray_node(cluster, ray_node, actor)
        return
    data = command.result or {}
    role = ray_node.role
    if not ok:
        reason = _error_text(command)
        _ray_node_status(ray_node, RayNodeStatus.FAILED, failure_reason=reason)
        if role == RayNodeRole.HEAD:
            if cluster.status == S.PENDING:
                ray_cluster_transition(
                    cluster=cluster, to=S.FAILED, reason=f"The head failed to start on {ray_node.node.name}: {reason}"
                )
        else:
            _event(cluster, "worker_failed", f"A worker failed to start on {ray_node.node.name}: {reason}")
        return
    _ray_node_status(
        ray_node,
        RayNodeStatus.RUNNING,
        container_id=str(data.get("container_id", ""))[:128],
        ray_node_id=str(data.get("ray_node_id", ""))[:128],
        ip=str(data.get("ip", ""))[:64],
    )
    actor = _operator_for(cluster)
    wanted = S.PENDING if role == RayNodeRole.HEAD else S.RUNNING
    if cluster.status != wanted or (role == RayNodeRole.HEAD and cluster.head_node_id != ray_node.node_id):
        # Stopped or deleted meanwhile: this Ray node must not stay up.
        if actor is not None:
            _stop_ray_node(cluster, ray_node, actor)
        _finish_delete_if_done(cluster)
        return
    if role == RayNodeRole.WORKER:
        _event(cluster, "worker_running", f"Worker on {ray_node.node.name} joined ({ray_node.ray_node_id or '?'})")
        return
    if cluster.is_kuberay:
        verb = "resumed" if data.get("resumed") else ("found" if data.get("existed") else "applied")
        ray_cluster_transition(
            cluster=cluster,
            to=S.RUNNING,
            head_ip="",
            head_hostname=str(data.get("hostname", ""))[:253],
            head_container_id=ray_node.container_id,
            started_at=timezone.now(),
        )
        _event(cluster, "kuberay", f"RayCluster {ray_node.container_id} {verb}; KubeRay's autoscaler runs the workers")
        return
    cluster = ray_cluster_transition(
        cluster=cluster,
        to=S.RUNNING,
        head_ip=ray_node.ip or ray_node.node.hostname,
        head_hostname=str(data.get("hostname") or ray_node.node.hostname)[:253],
        head_container_id=ray_node.container_id,
        started_at=timezone.now(),
    )
    if actor is not None:
        _start_workers(cluster, actor, cluster.min_workers, why="min_workers")


def _on_drain(cluster: RayCluster, ray_node: RayNode, command: Command, ok: bool) -> None:
    if ray_node.pending_command_id != command.pk:
        return
    if ok:
        _event(cluster, "worker_drained", f"Worker on {ray_node.node.name} drained; stopping it")
    elif command.error_code == "conflict":
        # Ray refuses an idle drain once the worker has picked up work again: keep it.
        _ray_node_status(ray_node, RayNodeStatus.RUNNING, pending_command=None)
        _event(
            cluster,
            "drain_refused",
            f"Ray refused to drain the worker on {ray_node.node.name} ({command.error_message}); keeping it",
        )
        return
    else:
        _event(
            cluster,
            "drain_failed",
            f"Drain of the worker on {ray_node.node.name} failed ({_error_text(command)}); stopping it anyway",
        )
    actor = _operator_for(cluster)
    if actor is None:
        _ray_node_status(ray_node, RayNodeStatus.FAILED, failure_reason="no Owner/Admin left to stop it")
        return
    _stop_ray_node(cluster, ray_node, actor)


def _on_stop(cluster: RayCluster, ray_node: RayNode, command: Command, ok: bool) -> None:
    if ray_node.pending_command_id != command.pk:
        return
    reason = "" if ok else _error_text(command)
    _ray_node_status(ray_node, RayNodeStatus.STOPPED, pending_command=None, failure_reason=reason)
    _event(
        cluster,
        "node_stopped",
        f"{ray_node.get_role_display()} on {ray_node.node.name} stopped"
        + (f" (agent said: {reason})" if reason else ""),
    )
    if ray_node.role == RayNodeRole.HEAD and cluster.status == S.RUNNING and cluster.head_node_id == ray_node.node_id:
        ray_cluster_transition(cluster=cluster, to=S.FAILED, reason="The head was stopped.")
        _stop_orphans(cluster)
    _finish_delete_if_done(cluster)


def _stop_orphans(cluster: RayCluster) -> None:
    """The head is gone: its workers cannot do anything useful, stop them."""
    actor = _operator_for(cluster)
    if actor is not None:
        _stop_all(cluster, actor, why="the head is gone")


def _on_status(cluster: RayCluster, ray_node: RayNode, command: Command, ok: bool) -> None:
    if not ok:
        _event(cluster, "status_failed", f"ray.status failed on the head: {_error_text(command)}")
        if command.error_code == "not_found" and cluster.status == S.RUNNING:
            _ray_node_status(ray_node, RayNodeStatus.FAILED, failure_reason=_error_text(command))
            ray_cluster_transition(
                cluster=cluster, to=S.FAILED, reason=f"The head is not running: {_error_text(command)}"
            )
            _stop_orphans(cluster)
        return
    if cluster.last_status_at and command.finished_at and command.finished_at < cluster.last_status_at:
        return  # an older status arriving late
    ray_cluster_record_status(cluster=cluster, status=command.result or {}, at=command.finished_at)
    host = ((command.result or {}).get("kuberay") or {}).get("head_host")
    if cluster.is_kuberay and isinstance(host, str) and host and host != cluster.head_hostname:
        RayCluster.objects.filter(pk=cluster.pk).update(head_hostname=host[:253])


_RESULT_HANDLERS = {
    "ray.head.start": _on_start,
    "ray.worker.start": _on_start,
    "ray.node.drain": _on_drain,
    "ray.node.stop": _on_stop,
    "ray.status": _on_status,
}


def _num(value: Any, default: float = 0.0) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _resources(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items() if isinstance(v, int | float) and not isinstance(v, bool)}


@transaction.atomic
def ray_cluster_record_status(*, cluster: RayCluster, status: dict[str, Any], at: dt.datetime | None = None) -> None:
    """Store a `ray.status` result: the cluster's latest status and each Ray node's usage and idle time.

    Status nodes are matched to our Ray nodes by `member_id` (the label we start them with), then by
    Ray node id.
    """
    at = at or timezone.now()
    RayCluster.objects.filter(pk=cluster.pk).update(last_status=status, last_status_at=at)
    cluster.last_status, cluster.last_status_at = status, at
    ours = {str(r.pk): r for r in cluster.ray_nodes.filter(status__in=RayNodeStatus.live()).select_related("node")}
    by_ray_id = {r.ray_node_id: r for r in ours.values() if r.ray_node_id}
    for entry in status.get("nodes", []) if isinstance(status.get("nodes"), list) else []:
        if not isinstance(entry, dict) or entry.get("alive") is False:
            continue
        ray_node = ours.get(str(entry.get("member_id", ""))) or by_ray_id.get(str(entry.get("ray_node_id", "")))
        if ray_node is None:
            continue
        host = ray_node.node  # the fleet node's own heartbeat figures, unless the agent reported per Ray node
        fields: dict[str, Any] = {
            "cpu_percent": _num(entry.get("cpu_percent"), host.cpu_percent),
            "memory_percent": _num(entry.get("memory_percent"), host.memory_percent),
            "gpu_count": int(_num(entry.get("gpu_count"), host.gpu_count)),
            "vram_used_mb": int(_num(entry.get("vram_used_mb"), host.vram_used_mb)),
            "vram_total_mb": int(_num(entry.get("vram_total_mb"), host.vram_total_mb)),
            "running_tasks": int(_num(entry.get("running_tasks"))),
            "idle_s": _num(entry.get("idle_s")),
            "resources": _resources(entry.get("resources")),
            "available": _resources(entry.get("available")),
        }
        if entry.get("ray_node_id") and not ray_node.ray_node_id:
            fields["ray_node_id"] = str(entry["ray_node_id"])[:128]
        RayNode.objects.filter(pk=ray_node.pk).update(**fields)


# --------------------------------------------------------------------------------------------------
# Autoscaler


def _worker_shape(cluster: RayCluster, workers: list[RayNode]) -> dict[str, float]:
    nodes, occupied = _worker_candidates(cluster)
    node = _next_worker_node(cluster, nodes, occupied)
    if node is not None and node.cpu_count:
        shape = {"CPU": float(node.cpu_count)}
        if node.gpu_count:
            shape["GPU"] = float(node.gpu_count)
        return shape
    for worker in workers:
        if worker.resources:
            return {k: v for k, v in worker.resources.items() if k in ("CPU", "GPU")}
    return {"CPU": 1.0}


def ray_cluster_autoscale(*, cluster: RayCluster) -> autoscaler.Decision | None:
    """One autoscaler pass for a running cluster: decide, record the decision, carry it out, ask for status.

    The decision uses the latest stored `ray.status` (pending demand, per-worker idle time) once: a status
    already decided on, or older than STATUS_MAX_AGE, is not reused; then only min/max bounds apply (no
    demand, nobody idle). Decisions that change nothing are recorded only when their reason changed.
    """
    with transaction.atomic():
        cluster = RayCluster.objects.select_for_update(skip_locked=True).filter(pk=cluster.pk).first()
        if cluster is None or cluster.status != S.RUNNING:
            return None
        actor = _operator_for(cluster)
        if actor is None:
            _event(cluster, "autoscaler", "Autoscaler skipped: no Owner or Admin left in the workspace")
            return None
        if cluster.is_kuberay:  # KubeRay's autoscaler sizes the worker group: only keep the status fresh
            head = _head(cluster)
            if head is not None:
                _request_status(cluster, head, actor)
            return None
        now = timezone.now()
        status = cluster.last_status or {}
        fresh = bool(
            cluster.last_status_at
            and now - cluster.last_status_at <= STATUS_MAX_AGE
            and (cluster.last_decided_status_at is None or cluster.last_status_at > cluster.last_decided_status_at)
        )
        workers = list(
            cluster.ray_nodes.filter(role=RayNodeRole.WORKER, status__in=RayNodeStatus.live()).select_related(
                "node__cluster"
            )
        )
        shape = _worker_shape(cluster, workers)
        states = [
            autoscaler.WorkerState(
                worker_id=str(w.pk),
                idle_s=w.idle_s if fresh else 0.0,
                resources=w.resources or shape,
                available=(w.available if fresh and w.resources else None),
                draining=w.status in (RayNodeStatus.DRAINING, RayNodeStatus.STOPPING),
                starting=w.status == RayNodeStatus.STARTING,
            )
            for w in workers
        ]
        head = _head(cluster)
        demand = autoscaler.ClusterDemand(
            pending=[_resources(b) for b in status.get("pending", [])] if fresh else [],
            head_free=(head.available if fresh and head is not None else {}),
            worker_shape=shape,
        )
        policy = autoscaler.ScalingPolicy(
            min_workers=cluster.min_workers, max_workers=cluster.max_workers, idle_timeout_s=cluster.idle_timeout_s
        )
        decision = autoscaler.decide(policy, states, demand)
        _record_decision(cluster, decision, fresh=fresh)
        transaction.on_commit(lambda: _count_decision(decision))
        if fresh:
            RayCluster.objects.filter(pk=cluster.pk).update(last_decided_status_at=cluster.last_status_at)
        if decision.add:
            _start_workers(cluster, actor, decision.add, why="autoscaler")
        by_id = {str(w.pk): w for w in workers}
        for worker_id in decision.remove:
            _drain_worker(cluster, by_id[worker_id], head, actor, why="autoscaler: idle")
        if head is not None:
            _request_status(cluster, head, actor)
        return decision


def _count_decision(decision: autoscaler.Decision) -> None:
    """The decision in the Prometheus counters (once it is committed, i.e. carried out)."""
    metrics.AUTOSCALER_DECISIONS.labels(action=metrics.autoscaler_action(decision.add, len(decision.remove))).inc()
    metrics.AUTOSCALER_WORKERS.labels(change="added").inc(decision.add)
    metrics.AUTOSCALER_WORKERS.labels(change="removed").inc(len(decision.remove))


def _record_decision(cluster: RayCluster, decision: autoscaler.Decision, *, fresh: bool) -> None:
    message = decision.summary()
    if not decision.changes:
        last = cluster.events.filter(kind="autoscaler").values_list("message", flat=True).first()
        if last == message:
            return
    _event(
        cluster,
        "autoscaler",
        message,
        add=decision.add,
        remove=decision.remove,
        reasons=decision.reasons,
        queued=decision.queued,
        used_status=fresh,
    )


def _request_status(cluster: RayCluster, head: RayNode, actor: Any) -> Command | None:
    in_flight = Command.objects.filter(
        node_id=head.node_id,
        command_type="ray.status",
        payload__member_id=str(head.pk),
        status__in=[CommandStatus.QUEUED, CommandStatus.DISPATCHED, CommandStatus.RUNNING],
    ).exists()
    if in_flight:
        return None
    payload = {
        "cluster_id": str(cluster.pk),
        "member_id": str(head.pk),
        "runtime": cluster.runtime,
        "gcs_port": cluster.gcs_port,
        "include_logs": True,
        "log_lines": STATUS_LOG_LINES,
    }
    try:
        return _dispatch(actor, head.node, "ray.status", payload)
    except IllegalTransition:
        return None


def autoscale_pass() -> int:
    """Beat: one autoscaler pass over every running Ray cluster, and the sweep of stuck deletions.

    Ray clusters on a compute cluster whose automation is paused (suspected partition) are skipped.

    Returns how many clusters were autoscaled.
    """
    done = 0
    running = RayCluster.objects.filter(status=S.RUNNING).exclude(
        compute_cluster__automation_paused_until__gt=timezone.now()  # partition pause: no rescheduling
    )
    for cluster in running.order_by("pk"):
        try:
            if ray_cluster_autoscale(cluster=cluster) is not None:
                done += 1
        except Exception:  # one broken cluster must not stop the others
            logger.exception("autoscaler pass failed for Ray cluster %s", cluster.pk)
    cutoff = timezone.now() - DELETE_GRACE
    for cluster in RayCluster.objects.filter(status=S.DELETING, status_changed_at__lt=cutoff):
        with transaction.atomic():
            _finish_delete_if_done(cluster, force=True)
    return done

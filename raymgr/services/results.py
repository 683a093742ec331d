"""Results of `ray.*` commands: `ray_on_command_finished` routes each to its handler; `ray.status` results
are stored by `ray_cluster_record_status`."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from django.db import transaction
from django.utils import timezone

from agent import protocol
from fleet.models import Command, CommandStatus
from raymgr.failures import failure_text
from raymgr.models import RayCluster, RayNode, RayNodeRole, RayNodeStatus
from raymgr.services.common import S, operator_for, record_event, resource_amounts
from raymgr.services.hosts import start_workers
from raymgr.services.launch import remove_failed_ray_node, stop_all, stop_ray_node
from raymgr.services.lifecycle import ray_cluster_finish_delete, ray_cluster_finish_stop
from raymgr.services.transitions import ray_cluster_transition, ray_node_set_status


def ray_on_command_finished(*, command: Command, **_: Any) -> None:
    """Advance Ray state from a finished `ray.*` command (receiver of `fleet.signals.command_finished`).

    Idempotent: a result is applied only while the Ray node still waits for that very command.
    """
    if not command.command_type.startswith("ray.") or command.status not in CommandStatus.terminal():
        return
    payload = command.parsed_payload  # the command type's protocol dataclass
    if payload is None:
        return
    try:
        cluster_uuid, member_uuid = uuid.UUID(payload.cluster_id), uuid.UUID(payload.member_id)
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
            # Stopped while it was starting: the stop may have run before the start. Still in flight, that
            # stop's result tells (`_on_stop`); over already, this Ray node is stopped again.
            container_id = command.parsed_result.container_id[:128]
            RayNode.objects.filter(pk=ray_node.pk).update(container_id=container_id)
            ray_node.container_id = container_id
            if ray_node.status == RayNodeStatus.STOPPED:
                _stop_again(cluster, ray_node, why="it started after its stop had run")
        return
    role = ray_node.role
    if not ok:
        reason = _error_text(command)
        ray_node_set_status(ray_node, RayNodeStatus.FAILED, failure_reason=reason)
        if role == RayNodeRole.HEAD:
            if cluster.status == S.PENDING:
                ray_cluster_transition(
                    cluster=cluster, to=S.FAILED, reason=f"The head failed to start on {ray_node.node.name}: {reason}"
                )
        else:
            record_event(cluster, "worker_failed", f"A worker failed to start on {ray_node.node.name}: {reason}")
        return
    result: protocol.RayNodeStartResult = command.parsed_result
    ray_node_set_status(
        ray_node,
        RayNodeStatus.RUNNING,
        container_id=result.container_id[:128],
        ray_node_id=result.ray_node_id[:128],
        ip=result.ip[:64],
    )
    actor = operator_for(cluster)
    wanted = S.PENDING if role == RayNodeRole.HEAD else S.RUNNING
    if cluster.status != wanted or (role == RayNodeRole.HEAD and cluster.head_node_id != ray_node.node_id):
        # Stopped or deleted meanwhile: this Ray node must not stay up.
        if actor is not None:
            stop_ray_node(cluster, ray_node, actor)
        ray_cluster_finish_stop(cluster)
        ray_cluster_finish_delete(cluster)
        return
    if role == RayNodeRole.WORKER:
        record_event(
            cluster, "worker_running", f"Worker on {ray_node.node.name} joined ({ray_node.ray_node_id or '?'})"
        )
        return
    if cluster.is_kuberay:
        verb = "resumed" if result.resumed else ("found" if result.existed else "applied")
        ray_cluster_transition(
            cluster=cluster,
            to=S.RUNNING,
            head_ip="",
            head_hostname=result.hostname[:253],
            head_container_id=ray_node.container_id,
            started_at=timezone.now(),
        )
        record_event(
            cluster, "kuberay", f"RayCluster {ray_node.container_id} {verb}; KubeRay's autoscaler runs the workers"
        )
        return
    cluster = ray_cluster_transition(
        cluster=cluster,
        to=S.RUNNING,
        head_gcs_port=_gcs_port_of(result) or cluster.head_gcs_port or cluster.gcs_port,
        head_ip=ray_node.ip or ray_node.node.hostname,
        head_hostname=(result.hostname or ray_node.node.hostname)[:253],
        head_container_id=ray_node.container_id,
        started_at=timezone.now(),
    )
    if actor is not None:
        start_workers(cluster, actor, cluster.min_workers, why="min_workers")


def _on_drain(cluster: RayCluster, ray_node: RayNode, command: Command, ok: bool) -> None:
    if ray_node.pending_command_id != command.pk:
        return
    if ok:
        record_event(cluster, "worker_drained", f"Worker on {ray_node.node.name} drained; stopping it")
    elif command.error_code == "conflict":
        # Ray refuses an idle drain once the worker has picked up work again: keep it.
        ray_node_set_status(ray_node, RayNodeStatus.RUNNING, pending_command=None)
        record_event(
            cluster,
            "drain_refused",
            f"Ray refused to drain the worker on {ray_node.node.name} ({command.error_message}); keeping it",
        )
        return
    else:
        record_event(
            cluster,
            "drain_failed",
            f"Drain of the worker on {ray_node.node.name} failed ({_error_text(command)}); stopping it anyway",
        )
    actor = operator_for(cluster)
    if actor is None:
        ray_node_set_status(ray_node, RayNodeStatus.FAILED, failure_reason="no Owner/Admin left to stop it")
        return
    stop_ray_node(cluster, ray_node, actor)


def _gcs_port_of(result: protocol.RayNodeStartResult) -> int | None:
    """The GCS port a head's start reports (``gcs_port``, else the port of ``gcs_address``), None if neither."""
    port = result.gcs_port
    if not port:
        tail = (result.gcs_address or "").rsplit(":", 1)[-1]
        port = int(tail) if tail.isdigit() else None
    return port if port and 0 < port < 65536 else None


def _stop_again(cluster: RayCluster, ray_node: RayNode, *, why: str) -> None:
    """Stop a Ray node whose stop is over but which runs (again); the cluster is stopping until it is gone."""
    actor = operator_for(cluster)
    if actor is None:
        return
    record_event(
        cluster, "stopping", f"Stopping the {ray_node.get_role_display().lower()} on {ray_node.node.name} again: {why}"
    )
    stop_ray_node(cluster, ray_node, actor)
    if cluster.status == S.STOPPED and ray_node.status == RayNodeStatus.STOPPING:
        ray_cluster_transition(cluster=cluster, to=S.STOPPING)


def _started_during(ray_node: RayNode, stop: Command) -> bool:
    """True when the Ray node's start succeeded after `stop` was sent (the stop may have found nothing)."""
    start = ray_node.start_command
    return bool(
        start is not None
        and start.status == CommandStatus.SUCCEEDED
        and start.finished_at is not None
        and start.finished_at >= stop.created_at
    )


def _on_stop(cluster: RayCluster, ray_node: RayNode, command: Command, ok: bool) -> None:
    if ray_node.pending_command_id != command.pk:
        return
    if ok and cluster.is_kuberay and cluster.status == S.DELETING and not command.parsed_payload.delete:
        # Deleted while its suspend was in flight: the suspend is over, now the RayCluster itself goes.
        ray_node_set_status(ray_node, RayNodeStatus.STOPPING, pending_command=None)
        actor = operator_for(cluster)
        if actor is not None:
            stop_ray_node(cluster, ray_node, actor)
            return
    reason = "" if ok else _error_text(command)
    ray_node_set_status(ray_node, RayNodeStatus.STOPPED, pending_command=None, failure_reason=reason)
    record_event(
        cluster,
        "node_stopped",
        f"{ray_node.get_role_display()} on {ray_node.node.name} stopped"
        + (f" (agent said: {reason})" if reason else ""),
    )
    if ok and (command.result or {}).get("stopped") is False and _started_during(ray_node, command):
        # The stop ran before the start it raced with: nothing was stopped, and the node runs now.
        _stop_again(cluster, ray_node, why="it started after its stop had run")
    if ray_node.role == RayNodeRole.HEAD and cluster.status == S.RUNNING and cluster.head_node_id == ray_node.node_id:
        ray_cluster_transition(cluster=cluster, to=S.FAILED, reason="The head was stopped.")
        _stop_orphans(cluster)
    ray_cluster_finish_stop(cluster)
    ray_cluster_finish_delete(cluster)


def _stop_orphans(cluster: RayCluster) -> None:
    """The head is gone: its workers cannot do anything useful, stop them."""
    actor = operator_for(cluster)
    if actor is not None:
        stop_all(cluster, actor, why="the head is gone")


def _on_status(cluster: RayCluster, ray_node: RayNode, command: Command, ok: bool) -> None:
    if not ok:
        record_event(cluster, "status_failed", f"ray.status failed on the head: {_error_text(command)}")
        if command.error_code == "not_found" and cluster.status == S.RUNNING:
            ray_node_set_status(ray_node, RayNodeStatus.FAILED, failure_reason=_error_text(command))
            ray_cluster_transition(
                cluster=cluster, to=S.FAILED, reason=f"The head is not running: {_error_text(command)}"
            )
            remove_failed_ray_node(cluster, ray_node)  # an exited head container stays on its node otherwise
            _stop_orphans(cluster)
        return
    if cluster.last_status_at and command.finished_at and command.finished_at < cluster.last_status_at:
        return  # an older status arriving late
    ray_cluster_record_status(cluster=cluster, status=command.result or {}, at=command.finished_at)
    result: protocol.RayStatusResult = command.parsed_result
    host = result.kuberay.head_host if result.kuberay is not None else ""
    if cluster.is_kuberay and host and host != cluster.head_hostname:
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


@transaction.atomic
def ray_cluster_record_status(*, cluster: RayCluster, status: dict[str, Any], at: dt.datetime | None = None) -> None:
    """Store a `ray.status` result: the cluster's latest status and each Ray node's usage and idle time.

    Status nodes are matched to our Ray nodes by `member_id` (the label we start them with), then by
    Ray node id.
    """
    at = at or timezone.now()
    RayCluster.objects.filter(pk=cluster.pk).update(last_status=status, last_status_at=at)
    cluster.last_status, cluster.last_status_at = status, at
    live = cluster.ray_nodes.filter(status__in=RayNodeStatus.live()).select_related("node__cluster")
    ours = {str(r.pk): r for r in live}
    by_ray_id = {r.ray_node_id: r for r in ours.values() if r.ray_node_id}
    listed: set[str] = set()
    for entry in status.get("nodes", []) if isinstance(status.get("nodes"), list) else []:
        if not isinstance(entry, dict) or entry.get("alive") is False:
            continue
        ray_node = ours.get(str(entry.get("member_id", ""))) or by_ray_id.get(str(entry.get("ray_node_id", "")))
        if ray_node is None:
            continue
        listed.add(str(ray_node.pk))
        host = ray_node.node  # the fleet node's own heartbeat figures, unless the agent reported per Ray node
        fields: dict[str, Any] = {
            "cpu_percent": _num(entry.get("cpu_percent"), host.cpu_percent),
            "memory_percent": _num(entry.get("memory_percent"), host.memory_percent),
            "gpu_count": int(_num(entry.get("gpu_count"), host.gpu_count)),
            "vram_used_mb": int(_num(entry.get("vram_used_mb"), host.vram_used_mb)),
            "vram_total_mb": int(_num(entry.get("vram_total_mb"), host.vram_total_mb)),
            "running_tasks": int(_num(entry.get("running_tasks"))),
            "idle_s": _num(entry.get("idle_s")),
            "resources": resource_amounts(entry.get("resources")),
            "available": resource_amounts(entry.get("available")),
        }
        if entry.get("ray_node_id") and not ray_node.ray_node_id:
            fields["ray_node_id"] = str(entry["ray_node_id"])[:128]
        RayNode.objects.filter(pk=ray_node.pk).update(**fields)
    _fail_vanished(cluster, [r for key, r in ours.items() if key not in listed], status)


def _fail_vanished(cluster: RayCluster, missing: list[RayNode], status: dict[str, Any]) -> None:
    """Running workers that had joined Ray (their Ray node id known) and that the head's status no longer
    lists among its live nodes died (their container was killed, their process exited): they fail, saying
    so, their agent is told to remove what is left of them (`remove_failed_ray_node`), and the autoscaler
    starts others to keep `min_workers`. Only a status that lists nodes counts."""
    if not isinstance(status.get("nodes"), list) or not status["nodes"]:
        return
    for ray_node in missing:
        if ray_node.role != RayNodeRole.WORKER or ray_node.status != RayNodeStatus.RUNNING or not ray_node.ray_node_id:
            continue
        reason = f"Ray no longer lists this worker among its live nodes (on {ray_node.node.name}): it died"
        ray_node_set_status(ray_node, RayNodeStatus.FAILED, failure_reason=reason)
        record_event(cluster, "worker_lost", f"Worker {ray_node.pk.hex[:8]} lost: {reason}")
        remove_failed_ray_node(cluster, ray_node)  # its exited container stays on its node otherwise

"""Operator actions on a Ray cluster: create, update, start, stop, delete (and the final stop and removal)."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from audit.services import created, new, on, operator_action
from fleet.models import ComputeCluster
from raymgr.models import RayCluster, RayNodeStatus, RayRuntime
from raymgr.quotas import admit_ray_cluster
from raymgr.services.common import (
    KUBE_MODES,
    STOP_GRACE,
    UPDATABLE,
    S,
    lock_hosts,
    ray_cluster_stopping,
    record_event,
)
from raymgr.services.launch import launch_head, stop_all
from raymgr.services.transitions import ray_cluster_transition, ray_node_set_status
from raymgr.versions import default_version, version_error
from tenancy.mixins import require_operator
from tenancy.models import Workspace

logger = logging.getLogger(__name__)


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
    gcs_port: int | None = None,
    dashboard_port: int = 8265,
    checkpoint_on_stop: bool = False,
    worker_cpus: float = 1.0,
    worker_memory_mb: int = 2048,
    worker_gpus: int = 0,
    serves_vllm: bool = False,
) -> RayCluster:
    """Create a Ray cluster (Owner/Admin only) and place its head; it starts `pending`.

    On kubernetes/argocd compute clusters the runtime is always kuberay (a KubeRay RayCluster whose
    worker pods request `worker_cpus`, `worker_memory_mb` and `worker_gpus`); kuberay is refused
    elsewhere. `ray_version` must be one the runtime offers (`raymgr.versions`); None picks the runtime's
    default. `gcs_port` None (the default): the head's node picks a free port at each start, so it never
    collides with anything listening there (a Redis on 6379 above all). Placement failures do not raise: the
    cluster is created `failed` with the reason recorded. The workspace's quotas (a Ray cluster more, and
    what its head requests) refuse it with `QuotaExceeded` (409) and nothing is written. `serves_vllm` (docker
    runtime only, a Ray version paired with a vLLM release): its containers run the image carrying vLLM.
    """
    require_operator(actor, workspace, what="manage Ray clusters")
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
    if serves_vllm and "runtime" not in errors and "ray_version" not in errors:
        errors.update(_vllm_error(runtime, ray_version))
    if gcs_port is not None and gcs_port == dashboard_port:
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
        serves_vllm=serves_vllm,
        created_by=actor,
    )
    cluster.full_clean(exclude=["workspace", "compute_cluster", "created_by"], validate_constraints=False)
    admit_ray_cluster(workspace.pk)  # the head is admitted as it is placed (`launch_head`)
    try:
        with transaction.atomic():
            cluster.save(force_insert=True)
    except IntegrityError:
        raise ValidationError({"name": "A Ray cluster with this name already exists in the workspace."}) from None
    record_event(
        cluster, "created", f"Created by {actor.get_username()} (Ray {cluster.ray_version}, {cluster.runtime})"
    )
    launch_head(cluster, actor)
    cluster.refresh_from_db()
    return cluster


def _vllm_error(runtime: str, ray_version: str) -> dict[str, str]:
    """Why a cluster of this runtime and Ray version cannot run the Ray image carrying vLLM ({} when it can)."""
    if runtime != RayRuntime.DOCKER:
        return {"serves_vllm": "Only a docker-runtime Ray cluster runs the Ray image carrying vLLM."}
    if not RayCluster(ray_version=ray_version).vllm_image():
        paired = ", ".join(sorted(settings.RAY_VLLM_VERSIONS)) or "none"
        return {"serves_vllm": f"No vLLM release is paired with Ray {ray_version} (RAY_VLLM_VERSIONS: {paired})."}
    return {}


@operator_action(
    "ray_cluster.update",
    target=on("cluster", "ray_cluster"),
    detail=lambda kw, _: {"fields": sorted(set(kw) - {"actor", "cluster"})},
)
def ray_cluster_update(*, actor: AbstractBaseUser, cluster: RayCluster, **fields: Any) -> RayCluster:
    """Change scaling bounds, idle timeout, checkpointing or (only when stopped/failed) the Ray version."""
    require_operator(actor, cluster.workspace, what="manage Ray clusters")
    unknown = sorted(set(fields) - set(UPDATABLE))
    if unknown:
        raise ValidationError({name: "This field cannot be changed." for name in unknown})
    cluster = RayCluster.objects.select_for_update().get(pk=cluster.pk)
    if "ray_version" in fields and fields["ray_version"] != cluster.ray_version:
        if cluster.status not in (S.STOPPED, S.FAILED):
            then = (
                "Wait until it has stopped, then change the version."
                if cluster.status == S.STOPPING
                else "Stop the cluster first, then change the version."
            )
            raise ValidationError(
                {
                    "ray_version": f"The Ray version cannot change while the cluster is {cluster.status}: "
                    f"it runs Ray {cluster.ray_version}. {then}"
                }
            )
        if version_error(cluster.runtime, fields["ray_version"]):
            raise ValidationError({"ray_version": version_error(cluster.runtime, fields["ray_version"])})
        if cluster.serves_vllm and _vllm_error(cluster.runtime, fields["ray_version"]):
            raise ValidationError(_vllm_error(cluster.runtime, fields["ray_version"]))
    for name, value in fields.items():
        setattr(cluster, name, value)
    errors = _validate_bounds(cluster.min_workers, cluster.max_workers, cluster.idle_timeout_s)
    if errors:
        raise ValidationError(errors)
    cluster.full_clean(exclude=["workspace", "compute_cluster", "created_by"], validate_constraints=False)
    cluster.save(update_fields=list(fields))
    if fields:
        record_event(
            cluster, "updated", "Settings changed: " + ", ".join(f"{k}={v}" for k, v in sorted(fields.items()))
        )
    return cluster


@operator_action("ray_cluster.start", target=on("cluster", "ray_cluster"))
def ray_cluster_start(*, actor: AbstractBaseUser, cluster: RayCluster) -> RayCluster:
    """stopped/failed → pending: place the head again; workers follow up to min_workers once it runs.

    Refused (409) while the cluster is still stopping: its Ray nodes still run and hold their ports, so a new
    head would meet them; start it once it has stopped.
    """
    require_operator(actor, cluster.workspace, what="manage Ray clusters")
    lock_hosts(cluster)
    cluster = ray_cluster_transition(
        cluster=cluster,
        to=S.PENDING,
        head_node=None,
        head_ip="",
        head_hostname="",
        head_container_id="",
        head_gcs_port=None,
    )
    stop_all(cluster, actor, why="left over from before the restart")
    launch_head(cluster, actor)
    cluster.refresh_from_db()
    return cluster


@operator_action("ray_cluster.stop", target=on("cluster", "ray_cluster"))
def ray_cluster_stop(*, actor: AbstractBaseUser, cluster: RayCluster) -> RayCluster:
    """→ stopping: every Ray node is stopped (running jobs are interrupted; checkpointed first when enabled);
    → stopped once their stop commands have finished (at once when none runs)."""
    require_operator(actor, cluster.workspace, what="manage Ray clusters")
    lock_hosts(cluster)
    ray_cluster_stopping.send(sender=RayCluster, ray_cluster=cluster)
    cluster = ray_cluster_transition(
        cluster=cluster, to=S.STOPPING, from_states=(S.PENDING, S.RUNNING, S.FAILED), started_at=None
    )
    stop_all(cluster, actor, why="cluster stopped")
    return ray_cluster_finish_stop(cluster)


def ray_cluster_finish_stop(cluster: RayCluster, *, force: bool = False) -> RayCluster:
    """stopping → stopped once no Ray node of the cluster is live any more.

    With `force` (a stop that got no answer within `STOP_GRACE`), the Ray nodes still waiting are marked
    stopped with the reason, and the cluster too.
    """
    cluster.refresh_from_db(fields=["status"])
    if cluster.status != S.STOPPING:
        return cluster
    live = cluster.ray_nodes.filter(status__in=RayNodeStatus.live())
    if force:
        for ray_node in live:
            ray_node_set_status(
                ray_node,
                RayNodeStatus.STOPPED,
                pending_command=None,
                failure_reason=f"no answer to its stop within {int(STOP_GRACE.total_seconds() // 60)} minutes",
            )
    elif live.exists():
        return cluster
    return ray_cluster_transition(cluster=cluster, to=S.STOPPED)


@operator_action("ray_cluster.delete", target=on("cluster", "ray_cluster"))
def ray_cluster_delete(*, actor: AbstractBaseUser, cluster: RayCluster) -> RayCluster | None:
    """→ deleting: stop every Ray node; the row (and what references it) goes once they are stopped.

    Returns None when the cluster was deleted at once (no Ray node was live).
    """
    require_operator(actor, cluster.workspace, what="manage Ray clusters")
    lock_hosts(cluster)
    if cluster.status in (S.PENDING, S.RUNNING):
        ray_cluster_stopping.send(sender=RayCluster, ray_cluster=cluster)
    cluster = ray_cluster_transition(cluster=cluster, to=S.DELETING)
    stop_all(cluster, actor, why="cluster deleted")
    return ray_cluster_finish_delete(cluster)


def ray_cluster_finish_delete(cluster: RayCluster, *, force: bool = False) -> RayCluster | None:
    """Delete a `deleting` cluster's row once no Ray node is live (at once with `force`); None once deleted."""
    if cluster.status != S.DELETING:
        return cluster
    if not force and cluster.ray_nodes.filter(status__in=RayNodeStatus.live()).exists():
        return cluster
    logger.info("Ray cluster %s deleted", cluster.pk)
    RayCluster.objects.filter(pk=cluster.pk, status=S.DELETING).delete()
    return None

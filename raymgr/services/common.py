"""Shared by the Ray cluster services: constants, the stopping signal, events, whom automatic work runs as,
and sending a command to a node."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import django.dispatch
from django.contrib.auth.base_user import AbstractBaseUser

from agent import protocol
from fleet import services as fleet_services
from fleet.models import Command, Mode, Node
from raymgr.models import RayCluster, RayClusterEvent, RayClusterStatus, RayNode, RayNodeRole, RayNodeStatus
from tenancy.models import Membership, Role
from tenancy.permissions import can_operate

S = RayClusterStatus
# Heads of clusters in these states hold their ports on their node (a stopping head runs until its stop ends).
PORT_HOLDING = (S.PENDING, S.RUNNING, S.STOPPING, S.DELETING)
# A deleting cluster whose stop commands never finish (node gone for good) is removed after this.
DELETE_GRACE = dt.timedelta(minutes=10)
# A stopping cluster whose stop commands never finish is marked stopped after this (its nodes: no answer).
STOP_GRACE = dt.timedelta(minutes=10)
# The GCS port of a KubeRay head (its pod has a network of its own: Ray's default is free there).
KUBERAY_GCS_PORT = protocol.RAY_GCS_PORT
# The autoscaler decides on a stored status only if it is at most this old.
STATUS_MAX_AGE = dt.timedelta(minutes=2)
STATUS_LOG_LINES = 100
UPDATABLE = ("min_workers", "max_workers", "idle_timeout_s", "ray_version", "checkpoint_on_stop")
# Compute-cluster modes whose Ray clusters are KubeRay RayClusters.
KUBE_MODES = (Mode.KUBERNETES, Mode.ARGOCD)

# Sent with `ray_cluster=<RayCluster>` just before its Ray nodes are stopped, so the jobs/experiments
# app can checkpoint them first when `ray_cluster.checkpoint_on_stop` is set.
ray_cluster_stopping = django.dispatch.Signal()


def record_event(cluster: RayCluster | uuid.UUID, kind: str, message: str, **data: Any) -> RayClusterEvent:
    """Record an event on the cluster's timeline (`cluster` may be a bare id)."""
    cluster_id = cluster.pk if isinstance(cluster, RayCluster) else cluster
    return RayClusterEvent.objects.create(ray_cluster_id=cluster_id, kind=kind, message=message, data=data)


def operator_for(cluster: RayCluster) -> AbstractBaseUser | None:
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


def dispatch(actor: Any, node: Node, command_type: str, payload: Any, *, as_workload: bool = False) -> Command:
    """Queue one command for `node` as `actor` through fleet's `command_queue`; it leaves on commit.

    `payload` is the command type's protocol dataclass (`agent.protocol.payloads`); `as_workload`: a Ray
    workload's own command, which a Member's action may send. Anything else (a dict) is a `TypeError`."""
    if not isinstance(payload, protocol.PAYLOAD_TYPES[command_type]):
        raise TypeError(f"a {command_type} payload is built as its protocol dataclass, not {type(payload).__name__}")
    (command,) = fleet_services.command_queue(
        actor=actor,
        cluster=node.cluster,
        command_type=command_type,
        payload=payload,
        node=node,
        as_workload=as_workload,
    )
    return command


def stop_in_flight(ray_node: RayNode) -> bool:
    """True while a `ray.node.stop` of this Ray node is under way (a second one must not be sent)."""
    return ray_node.status == RayNodeStatus.STOPPING and ray_node.pending_command_id is not None


def head_gcs_port(cluster: RayCluster) -> int:
    """The current head's GCS port, for the commands sent to it; Ray's default when not known (yet)."""
    return cluster.head_gcs_port or protocol.RAY_GCS_PORT


def running_head(cluster: RayCluster) -> RayNode | None:
    """The cluster's running head Ray node (with its fleet node), or None."""
    return cluster.ray_nodes.filter(role=RayNodeRole.HEAD, status=RayNodeStatus.RUNNING).select_related("node").first()


def resource_amounts(value: Any) -> dict[str, float]:
    """A Ray resource map with only its numeric amounts, as floats (anything else: empty)."""
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def lock_hosts(cluster: RayCluster) -> list[Node]:
    """Lock the nodes that host the cluster's live Ray nodes, in primary-key order, before anything of the
    cluster: the fleet's one lock order puts nodes before what a command's outcome touches (its command, then
    the Ray node and cluster rows, `raymgr.services.results`), so stopping many Ray nodes in one transaction
    cannot deadlock with an outcome being recorded on one of their hosts."""
    live = RayNode.objects.filter(ray_cluster=cluster, status__in=RayNodeStatus.live()).values("node_id")
    return list(Node.objects.select_for_update().filter(pk__in=live).order_by("pk"))

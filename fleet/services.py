"""Writes for the compute fleet. Keyword-only, one transaction each, side effects on commit.

State machines:
- Node status: one service per transition (`node_cordon`, `node_uncordon`, `node_drain`, ...), each a
  conditional UPDATE from the states it accepts, so concurrent changes cannot both win.
- Command status: every change goes through `command_transition`, which refuses illegal moves and
  ignores exact duplicates.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import logging
import secrets
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, models, transaction
from django.db.models import Count, F
from django.utils import timezone

from agent import protocol
from cleverthis.audit.services import (
    Target,
    created,
    entry_for_commands,
    entry_settle,
    new,
    on,
    operator_action,
    target_of,
)
from cleverthis.tenancy.models import Workspace
from cleverthis.tenancy.permissions import can_operate
from fleet import ca, enqueue, metrics_history, signals
from fleet.exceptions import JoinTokenRejected
from fleet.models import (
    ClusterEvent,
    Command,
    CommandStatus,
    ComputeCluster,
    JoinToken,
    Mode,
    Namespace,
    Node,
    NodeCertificate,
    NodeEvent,
    NodeStatus,
    RevokedSerial,
)
from fleet.payloads import split_secrets, validate_payload
from fleet.tunnel import groups
from kernel import metrics
from kernel.exceptions import IllegalTransition

logger = logging.getLogger(__name__)

JOIN_TOKEN_PREFIX = "ct_node_"
JOIN_TOKEN_TTL = dt.timedelta(hours=24)
ARGOCD_FIELDS = ("argocd_server", "argocd_token", "git_repo_url", "git_branch")
CLUSTER_FIELDS = ("name", "description", *ARGOCD_FIELDS)
# Commands that put new work on a node; refused for cordoned and draining nodes.
SCHEDULING_COMMANDS = frozenset(
    {"container.create", "endpoint.start", "model.download", "ray.head.start", "ray.worker.start"}
)


def _require_operator(actor: Any, workspace: Workspace) -> None:
    if not can_operate(actor, workspace):
        raise PermissionDenied("Only workspace Owners and Admins can do this.")


def _event(node_id: uuid.UUID, kind: str, message: str, *, data: dict | None = None, command=None) -> NodeEvent:
    return NodeEvent.objects.create(node_id=node_id, kind=kind, message=message, data=data or {}, command=command)


def _full_clean(obj: Any, *, exclude: Iterable[str] = ()) -> None:
    obj.full_clean(exclude=list(exclude), validate_constraints=False)


# --------------------------------------------------------------------------------------------------
# Clusters


def _clean_cluster_fields(fields: dict[str, Any]) -> dict[str, Any]:
    unknown = set(fields) - set(CLUSTER_FIELDS) - {"mode"}
    if unknown:
        raise ValidationError({name: "Unknown field." for name in sorted(unknown)})
    for name, value in fields.items():
        if not isinstance(value, str):
            raise ValidationError({name: "Must be a string."})
    return fields


@operator_action(
    "cluster.create",
    target=new("cluster"),
    result=created("cluster"),
    detail=lambda kw, _: {"mode": kw.get("mode", Mode.STANDALONE)},
)
def cluster_create(
    *,
    actor: AbstractBaseUser,
    workspace: Workspace,
    name: str,
    mode: str = Mode.STANDALONE,
    description: str = "",
    **argocd: str,
) -> ComputeCluster:
    """Create a compute cluster; Owner/Admin only; the mode is fixed from now on."""
    _require_operator(actor, workspace)
    _clean_cluster_fields({"name": name, "mode": mode, "description": description, **argocd})
    if mode not in Mode.values:
        raise ValidationError({"mode": f"Unknown mode {mode!r}; choose one of {', '.join(Mode.values)}."})
    cluster = ComputeCluster(workspace=workspace, name=name.strip(), description=description, mode=mode, **argocd)
    _full_clean(cluster)
    if mode == Mode.ARGOCD:
        _require_argocd(cluster)
    try:
        with transaction.atomic():
            cluster.save()
    except IntegrityError:
        raise ValidationError({"name": "A cluster with this name already exists in the workspace."}) from None
    return cluster


def _require_argocd(cluster: ComputeCluster) -> None:
    missing = {f: "Required in argocd mode." for f in ("argocd_server", "git_repo_url") if not getattr(cluster, f)}
    if missing:
        raise ValidationError(missing)


@operator_action(
    "cluster.update",
    target=on("cluster", "cluster"),
    detail=lambda kw, _: {"fields": sorted(set(kw) - {"actor", "cluster"})},
)
def cluster_update(*, actor: AbstractBaseUser, cluster: ComputeCluster, **fields: Any) -> ComputeCluster:
    """Change a cluster's name, description or ArgoCD settings; changing the mode is refused."""
    _require_operator(actor, cluster.workspace)
    _clean_cluster_fields(fields)
    if "mode" in fields and fields["mode"] != cluster.mode:
        raise ValidationError({"mode": "The orchestration mode cannot be changed after the cluster is created."})
    fields.pop("mode", None)
    cluster = ComputeCluster.objects.select_for_update().get(pk=cluster.pk)
    for name, value in fields.items():
        setattr(cluster, name, value.strip() if name == "name" else value)
    _full_clean(cluster, exclude=["workspace"])
    if cluster.mode == Mode.ARGOCD:
        _require_argocd(cluster)
    try:
        with transaction.atomic():
            cluster.save()
    except IntegrityError:
        raise ValidationError({"name": "A cluster with this name already exists in the workspace."}) from None
    return cluster


@operator_action("cluster.delete", target=on("cluster", "cluster"))
def cluster_delete(*, actor: AbstractBaseUser, cluster: ComputeCluster) -> None:
    """Delete a cluster and all its nodes (each node's certificates are revoked first)."""
    _require_operator(actor, cluster.workspace)
    for node in list(cluster.nodes.all()):
        _node_delete(node=node)
    cluster.delete()


# --------------------------------------------------------------------------------------------------
# Join tokens and registration


def hash_join_token(raw: str) -> str:
    """SHA-256 hex of a raw join token, as stored."""
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def join_command(raw_token: str, base_url: str | None = None) -> str:
    """The one-line install command an operator pastes on the new node (at `base_url` if given)."""
    base = (base_url or settings.CONTROL_PLANE_URL).rstrip("/")
    return f"curl -fsSL {base}/agent/install.sh | CLUSTER_TOKEN={raw_token} sh"


@operator_action(
    "join_token.create",
    target=on("cluster", "cluster"),
    detail=lambda _, value: (
        {"join_token": str(value[0].pk), "expires_at": value[0].expires_at.isoformat()} if value else {}
    ),
)
def join_token_create(*, cluster: ComputeCluster, actor: AbstractBaseUser) -> tuple[JoinToken, str]:
    """Mint a join token for `cluster`; returns the row and the raw token (shown once, never stored)."""
    _require_operator(actor, cluster.workspace)
    raw = JOIN_TOKEN_PREFIX + base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii").rstrip("=")
    token = JoinToken.objects.create(
        cluster=cluster,
        token_hash=hash_join_token(raw),
        created_by=actor,
        expires_at=timezone.now() + JOIN_TOKEN_TTL,
    )
    return token, raw


def _facts(facts: protocol.HostFacts | dict[str, Any]) -> protocol.HostFacts:
    if isinstance(facts, protocol.HostFacts):
        parsed = facts
    else:
        try:
            parsed = protocol.from_dict(protocol.HostFacts, facts, where="facts")
        except protocol.ProtocolError as exc:
            raise ValidationError({"facts": str(exc)}) from None
    limits = {"hostname": 253, "os": 200, "arch": 50, "agent_version": 100}
    errors = {f"facts.{k}": f"At most {n} characters." for k, n in limits.items() if len(getattr(parsed, k)) > n}
    if not parsed.hostname.strip():
        errors["facts.hostname"] = "The hostname must not be empty."
    if parsed.cpu_count < 0 or parsed.memory_total_mb < 0:
        errors["facts"] = "cpu_count and memory_total_mb must not be negative."
    if len(parsed.gpus) > 64:
        errors["facts.gpus"] = "At most 64 GPUs."
    if errors:
        raise ValidationError(errors)
    return parsed


def _gpu_fields(gpus: list[protocol.GpuInfo]) -> dict[str, Any]:
    return {
        "gpus": [protocol.to_dict(g) for g in gpus],
        "gpu_count": len(gpus),
        "gpu_model": (gpus[0].name[:200] if gpus else ""),
        "vram_total_mb": sum(max(g.memory_total_mb, 0) for g in gpus),
        "vram_used_mb": sum(max(g.memory_used_mb, 0) for g in gpus),
        "gpu_utilization_percent": (sum(g.utilization_percent for g in gpus) / len(gpus)) if gpus else 0.0,
    }


def _fact_fields(facts: protocol.HostFacts) -> dict[str, Any]:
    return {
        "hostname": facts.hostname,
        "cpu_count": max(facts.cpu_count, 0),
        "memory_total_mb": max(facts.memory_total_mb, 0),
        "agent_version": facts.agent_version,
        "os": facts.os,
        "arch": facts.arch,
        **_gpu_fields(facts.gpus),
    }


def node_register(
    *,
    token: str,
    csr_pem: str,
    facts: protocol.HostFacts | dict[str, Any],
    cluster_id: uuid.UUID | str | None = None,
) -> tuple[Node, str]:
    """Register a node with a join token and CSR; return the node and its signed certificate PEM.

    The token is consumed by a conditional UPDATE in the same transaction that creates the node, so it
    is single-use even under concurrent requests; any failure leaves neither a node nor a used token.
    `cluster_id`, when the agent names the cluster it expects, must match the token's cluster.
    """
    parsed = _facts(facts)
    if not isinstance(token, str) or not token.startswith(JOIN_TOKEN_PREFIX) or len(token) > 200:
        raise JoinTokenRejected("This is not a CleverThis join token.", "token_invalid")
    token_hash = hash_join_token(token)
    with transaction.atomic():
        now = timezone.now()
        row = JoinToken.objects.select_related("cluster").filter(token_hash=token_hash).first()
        if row is None:
            raise JoinTokenRejected("Unknown join token.", "token_invalid")
        if cluster_id is not None and str(row.cluster_id) != str(cluster_id):
            raise JoinTokenRejected("This join token belongs to another cluster.", "token_wrong_cluster")
        if row.used_at is not None:
            raise JoinTokenRejected("This join token has already been used.", "token_used")
        if row.expires_at <= now:
            raise JoinTokenRejected("This join token has expired; generate a new one.", "token_expired")
        claimed = JoinToken.objects.filter(pk=row.pk, used_at__isnull=True, expires_at__gt=now).update(used_at=now)
        if claimed != 1:
            raise JoinTokenRejected("This join token has already been used.", "token_used")
        node = Node(id=uuid.uuid4(), cluster=row.cluster, name=parsed.hostname[:100], **_fact_fields(parsed))
        cert_pem, serial, fingerprint = ca.sign_node_csr(csr_pem=csr_pem, node_id=node.id)
        node.save(force_insert=True)
        NodeCertificate.objects.create(
            node=node, serial=serial, fingerprint_sha256=fingerprint, certificate_pem=cert_pem
        )
        JoinToken.objects.filter(pk=row.pk).update(node=node)
        _event(node.id, "registered", f"Registered from host {parsed.hostname}", data={"serial": serial})
    return node, cert_pem


@transaction.atomic
def join_tokens_expire() -> int:
    """Delete expired, unused join tokens; returns how many."""
    deleted, _ = JoinToken.objects.filter(used_at__isnull=True, expires_at__lte=timezone.now()).delete()
    return deleted


# --------------------------------------------------------------------------------------------------
# Node state machine


def _transition_node(
    node: Node, *, to: str, allowed_from: Iterable[str], refusal: str, event: str, **extra: Any
) -> Node:
    """Move `node` to `to` if (and only if) its current status is in `allowed_from`; 409 otherwise."""
    now = timezone.now()
    updated = Node.objects.filter(pk=node.pk, status__in=list(allowed_from)).update(
        status=to, status_changed_at=now, **extra
    )
    if updated != 1:
        current = Node.objects.filter(pk=node.pk).values_list("status", flat=True).first()
        if current is None:
            raise IllegalTransition("This node no longer exists.")
        raise IllegalTransition(refusal.format(status=current))
    _event(node.pk, event, f"Status → {to}")
    node.refresh_from_db()
    return node


@operator_action("node.rename", target=on("node", "node"), detail=lambda kw, _: {"name": str(kw.get("name"))[:100]})
def node_rename(*, node: Node, actor: AbstractBaseUser, name: str) -> Node:
    """Give a node a display name (defaults to its hostname)."""
    _require_operator(actor, node.cluster.workspace)
    if not isinstance(name, str) or not name.strip():
        raise ValidationError({"name": "A name is required."})
    name = name.strip()
    if len(name) > 100:
        raise ValidationError({"name": "At most 100 characters."})
    old = node.name
    Node.objects.filter(pk=node.pk).update(name=name)
    node.name = name
    _event(node.pk, "renamed", f"Renamed from {old} to {name}")
    return node


@operator_action("node.cordon", target=on("node", "node"))
def node_cordon(*, node: Node, actor: AbstractBaseUser) -> Node:
    """online/offline → cordoned: no new workloads are scheduled on the node."""
    _require_operator(actor, node.cluster.workspace)
    return _transition_node(
        node,
        to=NodeStatus.CORDONED,
        allowed_from=[NodeStatus.ONLINE, NodeStatus.OFFLINE],
        refusal="Cannot cordon a node that is {status}.",
        event="cordoned",
    )


@operator_action("node.uncordon", target=on("node", "node"))
def node_uncordon(*, node: Node, actor: AbstractBaseUser) -> Node:
    """cordoned/draining → online (or offline when its agent is not connected)."""
    _require_operator(actor, node.cluster.workspace)
    target = NodeStatus.ONLINE if Node.objects.filter(pk=node.pk, connected=True).exists() else NodeStatus.OFFLINE
    return _transition_node(
        node,
        to=target,
        allowed_from=[NodeStatus.CORDONED, NodeStatus.DRAINING],
        refusal="Only cordoned or draining nodes can be uncordoned; this node is {status}.",
        event="uncordoned",
    )


@operator_action("node.drain", target=on("node", "node"))
def node_drain(*, node: Node, actor: AbstractBaseUser) -> Node:
    """online/cordoned → draining (→ cordoned at once when it runs no containers)."""
    _require_operator(actor, node.cluster.workspace)
    node = _transition_node(
        node,
        to=NodeStatus.DRAINING,
        allowed_from=[NodeStatus.ONLINE, NodeStatus.CORDONED],
        refusal="Cannot drain a node that is {status}.",
        event="draining",
    )
    if node.containers_count == 0:
        return _finish_drain(node)
    enqueue.drain_node(node.pk)
    return node


def _finish_drain(node: Node) -> Node:
    updated = Node.objects.filter(pk=node.pk, status=NodeStatus.DRAINING, containers_count=0).update(
        status=NodeStatus.CORDONED, status_changed_at=timezone.now()
    )
    if updated:
        _event(node.pk, "drained", "Drain finished: no containers left on the node; status → cordoned")
        node.refresh_from_db()
    return node


def _node_delete(*, node: Node) -> None:
    # Lock the node first: a record written for it meanwhile (an event of its reconnect, say) either
    # commits before the cascade below reads it, or waits and then finds the node gone. Without the
    # lock such a row committed between the cascade and this commit, and the delete failed (HTTP 500).
    list(Node.objects.select_for_update().filter(pk=node.pk).values_list("pk", flat=True))
    now = timezone.now()
    serials = list(NodeCertificate.objects.filter(node=node).values_list("serial", flat=True))
    NodeCertificate.objects.filter(node=node, revoked_at__isnull=True).update(revoked_at=now)
    RevokedSerial.objects.bulk_create(
        [RevokedSerial(serial=s, reason=f"node {node.pk} deleted") for s in serials], ignore_conflicts=True
    )
    node_id = node.pk
    Node.objects.filter(pk=node_id).delete()
    transaction.on_commit(lambda: groups.send_to_node(node_id, groups.revoke_message("node deleted")))
    transaction.on_commit(lambda: metrics_history.forget(node_id))


@operator_action("node.delete", target=on("node", "node"))
def node_delete(*, node: Node, actor: AbstractBaseUser) -> None:
    """Delete a node: its certificate serials go on the revocation list and its live tunnel is closed."""
    _require_operator(actor, node.cluster.workspace)
    _node_delete(node=node)


# ---- called by the tunnel consumer


def node_record_inventory(*, node: Node, inventory: protocol.Inventory) -> Node:
    """Store the node's inventory and reconcile containers, cached models and endpoints from it.

    The reconcile sets `containers_count` (active containers) and takes a drain's next step.
    """
    fields: dict[str, Any] = {"inventory": protocol.to_dict(inventory)}
    if inventory.gpus:
        fields.update(_gpu_fields(inventory.gpus))
    with transaction.atomic():
        Node.objects.filter(pk=node.pk).update(**fields)
        signals.inventory_received.send(sender=Node, node=node, inventory=inventory)
        node.refresh_from_db()
    return node


@transaction.atomic
def node_connected(
    *,
    node: Node,
    facts: protocol.HostFacts,
    inventory: protocol.Inventory,
    inbox: str = "",
    session: uuid.UUID | None = None,
    protocol_version: int = protocol.PROTOCOL_VERSION,
) -> None:
    """The node's agent authenticated on a tunnel: connected, offline → online, facts and inventory stored.

    `inbox` is the channel-layer inbox of the process holding the tunnel (`fleet.tunnel.local_tunnels`);
    `session` names this tunnel (a fresh id per socket) so that only its own close disconnects the node;
    `protocol_version` is the tunnel's. An agent one protocol version behind gets an event asking for its
    update. Call it before `command_pending_for_node` so no command queued meanwhile is missed.
    """
    now = timezone.now()
    fields = _fact_fields(_facts(facts))
    Node.objects.filter(pk=node.pk).update(
        connected=True,
        tunnel_inbox=inbox,
        tunnel_session=session or uuid.uuid4(),
        disconnected_at=None,
        last_heartbeat_at=now,
        protocol_version=protocol_version,
        **fields,
    )
    became_online = Node.objects.filter(pk=node.pk, status=NodeStatus.OFFLINE).update(
        status=NodeStatus.ONLINE, status_changed_at=now
    )
    node.refresh_from_db()
    node_record_inventory(node=node, inventory=inventory)
    message = "Agent connected" + ("; status → online" if became_online else f" (status stays {node.status})")
    _event(node.pk, "connected", message, data={"agent_version": facts.agent_version, "protocol": protocol_version})
    if protocol_version < protocol.PROTOCOL_VERSION:
        _event(
            node.pk,
            "agent.outdated",
            f"The agent speaks protocol {protocol_version}, one version behind this control plane "
            f"({protocol.PROTOCOL_VERSION}): it keeps working for now, but update it soon by re-running the "
            "install script on the node (it updates in place, without registering again).",
            data={"protocol": protocol_version, "agent_version": facts.agent_version},
        )


def node_agent_refused(*, node_id: uuid.UUID, protocol_version: int, accepted: tuple[int, int]) -> str:
    """An authenticated agent speaks a protocol older than this control plane accepts: its tunnel is
    refused (close code 4426). Records an event on the node saying what to do; returns that message."""
    message = (
        f"Agent refused: it speaks protocol {protocol_version}, "
        f"this control plane accepts {accepted[0]}-{accepted[1]}. "
        "Update the agent by re-running the install script on the node (it updates in place, without "
        "registering again)."
    )
    if Node.objects.filter(pk=node_id).exists():
        _event(node_id, "agent.too_old", message, data={"protocol": protocol_version, "accepted": list(accepted)})
    return message


@transaction.atomic
def node_disconnected(*, node: Node, inbox: str = "", session: uuid.UUID | None = None) -> None:
    """The node's tunnel closed: disconnected now, offline NODE_OFFLINE_GRACE_S later unless it reconnects.

    With `session` (the closing tunnel's id) only that tunnel's close counts: an old socket noticed late
    never hides the agent's new tunnel, whichever process holds it. Without it, `inbox` (the closing
    tunnel's process) does the same across processes. The grace lets a reconnect (an agent restart, a
    deploy) keep the node online with no offline flap; the pass that ends it is scheduled here.
    """
    node.connected = False
    rows = Node.objects.filter(pk=node.pk)
    if session is not None:
        rows = rows.filter(tunnel_session=session)
    elif inbox:
        rows = rows.filter(tunnel_inbox__in=[inbox, ""])
    if not rows.update(connected=False, tunnel_inbox="", disconnected_at=timezone.now()):
        return  # a deleted node, or a newer tunnel holds it: no event
    grace = settings.NODE_OFFLINE_GRACE_S
    online = Node.objects.filter(pk=node.pk, status=NodeStatus.ONLINE).exists()
    suffix = f"; offline in {grace} s unless it reconnects" if online else ""
    _event(node.pk, "disconnected", f"Agent disconnected (tunnel closed){suffix}")
    if online:
        enqueue.mark_lost_nodes_offline(countdown=grace + OFFLINE_PASS_BATCH_S)


def node_record_heartbeat(*, node_id: uuid.UUID | str, heartbeat: protocol.Heartbeat) -> None:
    """Store a heartbeat's utilization (and flip a connected node offline → online), in one UPDATE."""
    node_record_heartbeats(beats=[(node_id, heartbeat)])


_HEARTBEAT_SQL = """
UPDATE {table} AS n
   SET cpu_percent = v.cpu, memory_percent = v.mem, memory_used_mb = v.used,
       memory_total_mb = CASE WHEN v.total > 0 THEN v.total ELSE n.memory_total_mb END,
       gpus = COALESCE(v.gpus, n.gpus),
       vram_used_mb = COALESCE(v.vram_used, n.vram_used_mb),
       vram_total_mb = COALESCE(v.vram_total, n.vram_total_mb),
       gpu_utilization_percent = COALESCE(v.gpu_util, n.gpu_utilization_percent),
       last_heartbeat_at = %s,
       status = CASE WHEN n.status = 'offline' AND n.connected THEN 'online' ELSE n.status END,
       status_changed_at = CASE WHEN n.status = 'offline' AND n.connected THEN %s ELSE n.status_changed_at END
  FROM (VALUES {rows}) AS v(id, cpu, mem, used, total, gpus, vram_used, vram_total, gpu_util)
 WHERE n.id = v.id
RETURNING n.id, n.connected, n.status = 'online' AND n.status_changed_at = %s
"""
_HEARTBEAT_ROW = (
    "(%s::uuid, %s::float8, %s::float8, %s::bigint, %s::bigint, %s::jsonb, %s::bigint, %s::bigint, %s::float8)"
)


def node_record_heartbeats(*, beats: list[tuple[uuid.UUID | str, protocol.Heartbeat]]) -> set[uuid.UUID]:
    """Store many nodes' heartbeats (utilization; connected offline → online) in one UPDATE … FROM (VALUES …).

    The batched form for a process holding hundreds of tunnels: heartbeats that arrive together
    cost one statement and one commit together. GPU columns change only for beats that carry GPUs.
    A node recorded disconnected stays offline (its hello brings it back, with an event).
    Returns the nodes among them the database holds as disconnected (the beat marked them lost, or a
    late disconnect of an older socket cleared the flag): the tunnel that carried such a heartbeat
    must close, so the agent reconnects and the node is connected again through its hello.
    """
    if not beats:
        return set()
    from django.db import connection

    now = timezone.now()
    params: list[Any] = [now, now]
    for node_id, beat in beats:
        gpu = _gpu_fields(beat.gpus) if beat.gpus else None
        params += [
            str(node_id),
            beat.cpu_percent,
            beat.memory_percent,
            max(beat.memory_used_mb, 0),
            beat.memory_total_mb,
            json.dumps(gpu["gpus"]) if gpu else None,
            gpu["vram_used_mb"] if gpu else None,
            gpu["vram_total_mb"] if gpu else None,
            gpu["gpu_utilization_percent"] if gpu else None,
        ]
    sql = _HEARTBEAT_SQL.format(table=Node._meta.db_table, rows=", ".join([_HEARTBEAT_ROW] * len(beats))).strip()
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, now])
        rows = cursor.fetchall()
    came_back = [node_id for node_id, _, flipped in rows if flipped]
    if came_back:  # rare: a connected node left offline (an uncordon racing a reconnect)
        NodeEvent.objects.bulk_create(
            [NodeEvent(node_id=pk, kind="online", message="Heartbeat received; status → online") for pk in came_back]
        )
    known = {str(node_id) for node_id, _, _ in rows}
    metrics_history.record([_sample(node_id, beat) for node_id, beat in beats if str(node_id) in known])
    return {node_id for node_id, connected, _ in rows if not connected}


def _sample(node_id: uuid.UUID | str, beat: protocol.Heartbeat) -> metrics_history.Sample:
    """A heartbeat as a point of the node's utilization history (VRAM as a share of the GPUs' memory)."""
    gpu = _gpu_fields(beat.gpus) if beat.gpus else None
    vram = (100.0 * gpu["vram_used_mb"] / gpu["vram_total_mb"]) if gpu and gpu["vram_total_mb"] else None
    return metrics_history.Sample(
        node_id=node_id,
        cpu=beat.cpu_percent,
        memory=beat.memory_percent,
        gpu=gpu["gpu_utilization_percent"] if gpu else None,
        vram=vram,
    )


# A pass scheduled at a tunnel's close runs this long after its grace ends, so the nodes of a mass
# disconnect (a deploy, a partition) spread over this window go offline in one pass together.
OFFLINE_PASS_BATCH_S = 1


def nodes_mark_lost_offline() -> int:
    """Lost nodes go offline (with an event); all are marked disconnected. Returns how many went offline.

    Lost means either: its tunnel closed more than NODE_OFFLINE_GRACE_S ago and no new one came (an
    online node only; cordoned and draining keep their status), or it sent no heartbeat for
    NODE_OFFLINE_AFTER_S (a half-open socket: the agent froze or its network vanished without a close).
    Idempotent and safe against a reconnect: a node whose agent is back is connected and never taken,
    and rows being changed by a reconnect are skipped (this pass runs again: every 15 s on beat, and
    after every close).

    Partition safety: a cluster that loses more than FLEET_PARTITION_THRESHOLD of its nodes (and at
    least FLEET_PARTITION_MIN_NODES) in this one pass most likely lost its network, not its machines.
    The nodes still go offline, but the cluster's automatic drains and rescheduling pause for
    FLEET_PARTITION_PAUSE_S (`ComputeCluster.automation_paused_until`) and a `partition.suspected`
    cluster event records it.

    After the commit, a tunnel still held for any of these nodes is closed (`groups.silent_message`,
    through the channel layer to whichever replica holds it): its agent stopped heartbeating but kept
    the socket, so it reconnects, sends a fresh hello and gets every command queued meanwhile.
    """
    now = timezone.now()
    cutoff = now - dt.timedelta(seconds=settings.NODE_OFFLINE_AFTER_S)
    grace_cutoff = now - dt.timedelta(seconds=settings.NODE_OFFLINE_GRACE_S)
    silent = models.Q(
        status__in=[NodeStatus.ONLINE, NodeStatus.CORDONED, NodeStatus.DRAINING], last_heartbeat_at__lt=cutoff
    )
    closed = models.Q(status=NodeStatus.ONLINE, connected=False, disconnected_at__lte=grace_cutoff)
    with transaction.atomic():
        stale = Node.objects.select_for_update(skip_locked=True).filter(silent | closed)
        rows = list(stale.order_by("pk").values_list("pk", "status", "cluster_id", "connected", "disconnected_at"))
        if not rows:
            return 0
        transaction.on_commit(lambda: _close_silent_tunnels([row[0] for row in rows]))
        Node.objects.filter(pk__in=[row[0] for row in rows]).update(connected=False)
        online = [row for row in rows if row[1] == NodeStatus.ONLINE]
        Node.objects.filter(pk__in=[row[0] for row in online], status=NodeStatus.ONLINE).update(
            status=NodeStatus.OFFLINE, status_changed_at=now
        )
        NodeEvent.objects.bulk_create(
            [
                NodeEvent(node_id=pk, kind="offline", message=_offline_reason(connected, closed_at, now))
                for pk, _, _, connected, closed_at in online
            ]
        )
        _pause_partitioned_clusters([row[:3] for row in rows])
    return len(online)


def _offline_reason(connected: bool, disconnected_at: dt.datetime | None, now: dt.datetime) -> str:
    if not connected and disconnected_at is not None:
        seconds = max(0, round((now - disconnected_at).total_seconds()))
        return f"Tunnel closed {seconds} s ago and the agent did not reconnect; status → offline"
    return f"No heartbeat for {settings.NODE_OFFLINE_AFTER_S} s; status → offline"


def _close_silent_tunnels(node_ids: list[uuid.UUID]) -> None:
    """Ask whichever replica holds a tunnel of these lost nodes to close it (best effort: a node's next
    heartbeat through such a tunnel closes it too, see `node_record_heartbeats`)."""
    message = groups.silent_message(settings.NODE_OFFLINE_AFTER_S)
    try:
        sent = groups.send_to_nodes([(pk, message) for pk in node_ids])
    except Exception as exc:
        logger.warning("closing the tunnels of %d lost nodes failed: %s", len(node_ids), exc)
        return
    if not all(sent):
        logger.warning("closing the tunnels of %d of %d lost nodes failed", sent.count(False), len(node_ids))


def _pause_partitioned_clusters(lost: list[tuple[Any, str, Any]]) -> list[uuid.UUID]:
    """Pause automation of each cluster that lost more than the threshold of its nodes in one pass."""
    lost_by_cluster: dict[Any, int] = {}
    for _, _, cluster_id in lost:
        lost_by_cluster[cluster_id] = lost_by_cluster.get(cluster_id, 0) + 1
    totals = dict(
        Node.objects.filter(cluster_id__in=list(lost_by_cluster))
        .values("cluster_id")
        .annotate(n=Count("pk"))
        .values_list("cluster_id", "n")
    )
    threshold = settings.FLEET_PARTITION_THRESHOLD
    paused = []
    now = timezone.now()
    until = now + dt.timedelta(seconds=settings.FLEET_PARTITION_PAUSE_S)
    for cluster_id, count in sorted(lost_by_cluster.items(), key=lambda item: str(item[0])):
        total = totals.get(cluster_id, 0)
        if count < settings.FLEET_PARTITION_MIN_NODES or total == 0 or count / total <= threshold:
            continue
        ComputeCluster.objects.filter(pk=cluster_id).update(automation_paused_until=until)
        ClusterEvent.objects.create(
            cluster_id=cluster_id,
            kind="partition.suspected",
            message=(
                f"{count} of {total} nodes went silent at once (more than {threshold:.0%}): suspected network "
                f"partition; automatic drains and rescheduling paused until {until:%Y-%m-%d %H:%M:%S} UTC"
            ),
            data={"lost": count, "total": total, "threshold": threshold, "paused_until": until.isoformat()},
        )
        logger.warning("cluster %s: %s of %s nodes lost in one pass; automation paused", cluster_id, count, total)
        paused.append(cluster_id)
    return paused


@operator_action("cluster.resume_automation", target=on("cluster", "cluster"))
def cluster_resume_automation(*, actor: AbstractBaseUser, cluster: ComputeCluster) -> ComputeCluster:
    """End a partition pause early (Owner/Admin): drains and rescheduling run again from the next pass."""
    _require_operator(actor, cluster.workspace)
    ComputeCluster.objects.filter(pk=cluster.pk).update(automation_paused_until=None)
    ClusterEvent.objects.create(
        cluster=cluster, kind="automation.resumed", message=f"Automation resumed by {actor.get_username()}"
    )
    cluster.refresh_from_db()
    return cluster


# --------------------------------------------------------------------------------------------------
# Commands

_COMMAND_MOVES: dict[str, frozenset[str]] = {
    CommandStatus.DISPATCHED: frozenset({CommandStatus.QUEUED}),
    CommandStatus.RUNNING: frozenset({CommandStatus.QUEUED, CommandStatus.DISPATCHED}),
    CommandStatus.SUCCEEDED: frozenset({CommandStatus.QUEUED, CommandStatus.DISPATCHED, CommandStatus.RUNNING}),
    CommandStatus.FAILED: frozenset({CommandStatus.QUEUED, CommandStatus.DISPATCHED, CommandStatus.RUNNING}),
    CommandStatus.QUEUED: frozenset({CommandStatus.DISPATCHED}),  # un-claim after a failed send
}
_COMMAND_TIMESTAMP = {
    CommandStatus.DISPATCHED: "dispatched_at",
    CommandStatus.RUNNING: "acked_at",
    CommandStatus.SUCCEEDED: "finished_at",
    CommandStatus.FAILED: "finished_at",
}


def command_transition(
    *, command_id: uuid.UUID | str, to: str, node_id: uuid.UUID | str | None = None, **fields: Any
) -> Command | None:
    """Move a command to `to` with a conditional UPDATE; the one owner of Command status changes.

    Returns the updated command, or None when nothing changed: the row does not exist (or belongs to
    another node than `node_id`), or it already is in `to` (an exact duplicate, ignored). Raises
    `IllegalTransition` for any other move (e.g. succeeded → running).
    """
    rows = Command.objects.filter(pk=command_id)
    if node_id is not None:
        rows = rows.filter(node_id=node_id)
    now = timezone.now()
    stamp = _COMMAND_TIMESTAMP.get(to)
    if stamp:
        fields.setdefault(stamp, now)
    updated = rows.filter(status__in=list(_COMMAND_MOVES[to])).update(status=to, **fields)
    if updated:
        return rows.get()
    current = rows.values_list("status", flat=True).first()
    if current is None or current == to:
        return None
    raise IllegalTransition(f"A {current} command cannot become {to}.")


def _parse_uuid(value: Any, field: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except (ValueError, TypeError):
        raise ValidationError({field: "Must be a UUID."}) from None


def _dispatch_detail(kwargs: dict[str, Any], commands: list[Command] | None) -> dict[str, Any]:
    node = kwargs.get("node")
    detail: dict[str, Any] = {"command_type": str(kwargs.get("command_type"))[:32], "node": node.name if node else None}
    if commands:
        detail.update(batch_id=str(commands[0].batch_id), commands=len(commands))
    return detail


def _dispatch_target(kwargs: dict[str, Any]) -> Target:
    """The node, or the cluster for a fan-out; in the cluster's workspace either way."""
    cluster, node = kwargs["cluster"], kwargs.get("node")
    if node is None:
        return target_of(cluster, "cluster")
    return Target("node", str(node.pk), node.name, cluster.workspace_id)


@operator_action("command.dispatch", target=_dispatch_target, detail=_dispatch_detail)
def command_dispatch(
    *,
    actor: AbstractBaseUser,
    cluster: ComputeCluster,
    command_type: str,
    payload: dict[str, Any],
    node: Node | None = None,
) -> list[Command]:
    """An operator sends `command_type` to one node or every online node of `cluster` (audited; the
    entry follows the commands to their outcome). Otherwise as `command_queue`."""
    return command_queue(actor=actor, cluster=cluster, command_type=command_type, payload=payload, node=node)


def command_queue(
    *,
    actor: AbstractBaseUser,
    cluster: ComputeCluster,
    command_type: str,
    payload: dict[str, Any],
    node: Node | None = None,
) -> list[Command]:
    """Queue `command_type` for one node or for every online node of `cluster`; returns at once.

    No audit entry of its own: automatic work (drains, the Ray autoscaler and follow-ups) calls it, and
    so do services that send commands as part of a larger operator action (the commands then point at
    that action's entry). Commands queued outside any operator action are the control plane's own:
    marked `system`, credited to no user (`actor` is only whose rights they run with).
    Owner/Admin only. One Command row per target node (shared `batch_id`, own idempotency key); on
    commit one Celery task is enqueued: `dispatch_command` for a single target, `dispatch_batch` for
    several. A single offline node still gets its command: it stays
    queued and is delivered when the node reconnects. Cordoned and draining nodes refuse new work.
    """
    _require_operator(actor, cluster.workspace)
    clean = validate_payload(command_type, payload)
    public, secret = split_secrets(clean)
    with transaction.atomic():
        if node is not None:
            if node.cluster_id != cluster.pk:
                raise ValidationError({"node_id": "This node is not in this cluster."})
            node = Node.objects.select_for_update().filter(pk=node.pk).first()
            if node is None:
                raise IllegalTransition("This node no longer exists.")
            if command_type in SCHEDULING_COMMANDS and node.status in (NodeStatus.CORDONED, NodeStatus.DRAINING):
                raise IllegalTransition(f"The node is {node.status}: it takes no new {command_type} commands.")
            targets = [node]
        else:
            targets = list(Node.objects.filter(cluster=cluster, status=NodeStatus.ONLINE).order_by("pk"))
            if not targets:
                raise IllegalTransition("No online nodes in this cluster.")
        batch_id = uuid.uuid4()
        audit_entry = entry_for_commands()
        system = audit_entry is None  # not part of an operator action: the control plane's own work
        commands = [
            Command(
                node=target,
                cluster=cluster,
                batch_id=batch_id,
                command_type=command_type,
                payload=public,
                secrets=json.dumps(secret) if secret else "",
                idempotency_key=uuid.uuid4().hex,
                created_by=None if system else actor,
                system=system,
                audit_entry_id=audit_entry,
            )
            for target in targets
        ]
        Command.objects.bulk_create(commands)
        signals.commands_queued.send(sender=Command, commands=commands)
        NodeEvent.objects.bulk_create(
            [
                NodeEvent(
                    node_id=c.node_id,
                    kind="command.queued",
                    message=f"{command_type} queued by {'system' if system else actor.get_username()}",
                    command=c,
                )
                for c in commands
            ]
        )
        if len(commands) == 1:
            enqueue.dispatch_command(commands[0].pk)
        else:  # one task claims and sends the whole batch (fan-out to All nodes)
            enqueue.dispatch_batch(batch_id)
    return commands


def command_claim_and_send(*, command_id: uuid.UUID | str) -> bool:
    """Claim a queued command (queued → dispatched) and send it to its node's tunnel.

    Returns False and does nothing when the row is gone, already claimed, or its node is not
    connected (then it stays queued and `command_pending_for_node` delivers it on reconnect). A
    command claimed more than COMMAND_RESEND_AFTER_S ago and still unacknowledged is sent again (the
    task was redelivered after its worker died between claim and send; the agent deduplicates). If
    the send fails the claim is undone and the error re-raised for the task to retry.
    """
    row = Command.objects.filter(pk=command_id).values("node_id", "status", "node__connected").first()
    if row is None or row["status"] not in (CommandStatus.QUEUED, CommandStatus.DISPATCHED):
        return False
    if not row["node__connected"]:
        return False
    now = timezone.now()
    claimed = Command.objects.filter(pk=command_id, status=CommandStatus.QUEUED).update(
        status=CommandStatus.DISPATCHED, dispatched_at=now, attempts=F("attempts") + 1
    )
    if not claimed:
        # Redelivered after a crash between claim and send: claimed long ago, never acknowledged.
        stale = now - dt.timedelta(seconds=settings.COMMAND_RESEND_AFTER_S)
        claimed = Command.objects.filter(
            pk=command_id, status=CommandStatus.DISPATCHED, acked_at__isnull=True, dispatched_at__lt=stale
        ).update(dispatched_at=now, attempts=F("attempts") + 1)
    if not claimed:
        return False
    try:
        groups.send_to_node(row["node_id"], groups.command_message(command_id))
    except Exception:
        Command.objects.filter(pk=command_id, status=CommandStatus.DISPATCHED).update(status=CommandStatus.QUEUED)
        raise
    NodeEvent.objects.create(
        node_id=row["node_id"], kind="command.dispatched", message="Command sent to the node", command_id=command_id
    )
    return True


_BATCH_CLAIM_SQL = """
UPDATE fleet_command AS c
   SET status = 'dispatched', dispatched_at = %(now)s, attempts = c.attempts + 1
  FROM fleet_node AS n
 WHERE c.node_id = n.id AND n.connected AND c.batch_id = %(batch)s
   AND (c.status = 'queued'
        OR (c.status = 'dispatched' AND c.acked_at IS NULL AND c.dispatched_at < %(stale)s))
RETURNING c.id, c.node_id, c.command_type, c.idempotency_key, c.payload, c.secrets, n.tunnel_inbox
"""


def command_batch_claim_and_send(*, batch_id: uuid.UUID | str) -> int:
    """Claim all sendable commands of a batch with one conditional UPDATE … RETURNING, then send each.

    Sendable: queued on a connected node, or (a redelivered task) claimed more than
    COMMAND_RESEND_AFTER_S ago and never acknowledged. Commands of disconnected nodes stay queued
    for `command_pending_for_node`. Commands whose send fails are un-claimed (back to queued) and
    the task is failed for a retry. Returns how many were sent.
    """
    from django.db import connection

    now = timezone.now()
    stale = now - dt.timedelta(seconds=settings.COMMAND_RESEND_AFTER_S)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_BATCH_CLAIM_SQL, {"now": now, "batch": str(batch_id), "stale": stale})
        claimed = cursor.fetchall()
    if not claimed:
        return 0
    by_inbox: dict[str, list[int]] = {}
    messages = []
    for i, (pk, node_id, command_type, key, payload, secret, inbox) in enumerate(claimed):
        # The frame travels with the message (no read per node in the consumer) unless it has secrets.
        frame = None
        if not secret:
            payload = json.loads(payload) if isinstance(payload, str) else payload
            row = Command(pk=pk, idempotency_key=key, command_type=command_type, payload=payload)
            frame = groups.command_frame(row)
        messages.append((node_id, groups.command_message(pk, frame)))
        by_inbox.setdefault(inbox or "", []).append(i)
    claimed = [(pk, node_id) for pk, node_id, *_ in claimed]
    # One message per control-plane process holding tunnels; nodes with no known process, one each.
    sent = [False] * len(claimed)
    direct = by_inbox.pop("", [])
    for i, ok in zip(direct, groups.send_to_nodes([messages[i] for i in direct]), strict=True):
        sent[i] = ok
    for inbox, indexes in by_inbox.items():
        ok = groups.send_to_inbox(inbox, [messages[i] for i in indexes])
        for i in indexes:
            sent[i] = ok
    failed = [pk for (pk, _), ok in zip(claimed, sent, strict=True) if not ok]
    if failed:
        Command.objects.filter(pk__in=failed, status=CommandStatus.DISPATCHED).update(status=CommandStatus.QUEUED)
    NodeEvent.objects.bulk_create(
        [
            NodeEvent(node_id=node_id, kind="command.dispatched", message="Command sent to the node", command_id=pk)
            for (pk, node_id), ok in zip(claimed, sent, strict=True)
            if ok
        ]
    )
    if failed:
        raise ConnectionError(f"{len(failed)} of {len(claimed)} commands of batch {batch_id} could not be sent")
    return len(claimed)


def commands_resend_stuck(*, limit: int = 500) -> int:
    """Beat: send again what should have reached a connected node by now; returns how many were sent.

    Catches dispatch tasks lost with the broker (enqueued while Redis was down) and sends lost with a
    process: commands still queued COMMAND_RESEND_AFTER_S after creation, or claimed that long ago
    and never acknowledged, on nodes whose tunnel is up. Each goes through `command_claim_and_send`
    (the agent deduplicates by idempotency key); a failing send stops this pass for the next one.
    A command that was sent COMMAND_MAX_ATTEMPTS times and still never acknowledged is not sent again:
    it fails with the code `undelivered` and a message saying so (the Commands tab shows both), so no
    command waits forever on a node that looks connected.
    """
    stale = timezone.now() - dt.timedelta(seconds=settings.COMMAND_RESEND_AFTER_S)
    stuck = (
        Command.objects.filter(node__connected=True)
        .filter(
            models.Q(status=CommandStatus.QUEUED, created_at__lt=stale)
            | models.Q(status=CommandStatus.DISPATCHED, acked_at__isnull=True, dispatched_at__lt=stale)
        )
        .order_by("created_at")
        .values_list("pk", "node_id", "attempts")[:limit]
    )
    rows = list(stuck)
    given_up = [(pk, node_id, attempts) for pk, node_id, attempts in rows if attempts >= settings.COMMAND_MAX_ATTEMPTS]
    if given_up:
        _fail_undelivered(given_up)
    sent = 0
    for command_id, _, attempts in rows:
        if attempts >= settings.COMMAND_MAX_ATTEMPTS:
            continue
        try:
            sent += command_claim_and_send(command_id=command_id)
        except Exception:  # the channel layer is still away: the next pass tries again
            logger.warning("re-sending stuck command %s failed; retrying on the next pass", command_id)
            break
    return sent


def _fail_undelivered(rows: list[tuple[uuid.UUID, uuid.UUID, int]]) -> None:
    """Fail commands their connected node never acknowledged, however often they were sent."""
    waited = settings.COMMAND_RESEND_AFTER_S
    reports = [
        CommandReport.error(
            node_id,
            pk,
            code="undelivered",
            message=(
                f"The node never acknowledged this command: sent {attempts} times, the last more than {waited} s "
                "ago, while its tunnel looked connected. Not sent again; check the node's agent and retry."
            ),
        )
        for pk, node_id, attempts in rows
    ]
    with transaction.atomic():
        # An ack that arrived meanwhile wins: only rows still unacknowledged are failed.
        still = set(
            Command.objects.select_for_update()
            .filter(
                pk__in=[pk for pk, _, _ in rows],
                status__in=[CommandStatus.QUEUED, CommandStatus.DISPATCHED],
                acked_at__isnull=True,
            )
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        outcomes = command_record_reports(reports=[r for r in reports if r.command_id in still])
    for outcome in outcomes:
        if isinstance(outcome, Command):
            logger.warning("command %s failed as undelivered after %s sends", outcome.pk, outcome.attempts)


def command_pending_for_node(*, node: Node) -> list[Command]:
    """Unfinished commands of `node` (queued, dispatched or running), oldest first: sent on reconnect.

    Running ones too: their outcome may have been lost with the old socket. The agent deduplicates by
    idempotency key: one still running is only re-acknowledged, one already done re-sends its outcome.
    """
    return list(
        Command.objects.filter(
            node=node, status__in=[CommandStatus.QUEUED, CommandStatus.DISPATCHED, CommandStatus.RUNNING]
        ).order_by("created_at", "pk")
    )


def command_record_delivered(*, node: Node, command_id: uuid.UUID | str) -> Command | None:
    """The consumer sent a queued command itself (on reconnect): queued → dispatched."""
    with transaction.atomic():
        command = command_transition(
            command_id=command_id, node_id=node.pk, to=CommandStatus.DISPATCHED, attempts=F("attempts") + 1
        )
        if command:
            _event(node.pk, "command.dispatched", "Command sent to the node on reconnect", command=command)
    return command


def _after_command_acked(command: Command) -> None:
    """Let the rows a command concerns follow its ack (receivers of `fleet.signals.command_acked`)."""
    signals.command_acked.send(sender=Command, command=command)


def _after_command_finished(command: Command) -> None:
    """Once an outcome is recorded: workloads, drains and other apps (raymgr) follow it.

    Every receiver of `fleet.signals.command_finished` runs in a savepoint of its own and logs its
    failures, so a failing follow-up rolls back only its own writes, never the outcome.
    """
    try:
        with transaction.atomic():
            signals.command_finished.send(sender=Command, command=command)
    except Exception:
        logger.exception("command_finished receiver failed for command %s", command.pk)


def command_record_ack(*, node: Node, command_id: uuid.UUID | str, duplicate: bool = False) -> Command | None:
    """Agent acknowledged: → running. Frames about other nodes' commands are ignored (None)."""
    return _record_one(CommandReport.ack(node.pk, command_id, duplicate=duplicate))


def command_record_progress(
    *,
    node: Node,
    command_id: uuid.UUID | str,
    message: str,
    percent: float | None = None,
    data: dict[str, Any] | None = None,
) -> NodeEvent | None:
    """A progress step of a command: one event in the node's log (status untouched)."""
    command = Command.objects.filter(pk=command_id, node_id=node.pk).first()
    if command is None:
        logger.warning("progress for foreign or unknown command %s from node %s ignored", command_id, node.pk)
        return None
    text = message[:2000] + (f" ({percent:.0f}%)" if percent is not None else "")
    return _event(node.pk, "command.progress", text, data={"percent": percent, **(data or {})}, command=command)


def command_record_result(*, node: Node, command_id: uuid.UUID | str, data: dict[str, Any]) -> Command | None:
    """Command succeeded: → succeeded with `data` stored as its result."""
    return _record_one(CommandReport.result(node.pk, command_id, data))


def command_record_error(
    *, node: Node, command_id: uuid.UUID | str, code: str, message: str, data: dict[str, Any] | None = None
) -> Command | None:
    """Command failed: → failed with its error code and message."""
    return _record_one(CommandReport.error(node.pk, command_id, code=code, message=message, data=data))


@dataclass(frozen=True)
class CommandReport:
    """What an agent reported about one of its commands: ack (→ running), result (→ succeeded), error."""

    node_id: uuid.UUID
    command_id: Any
    to: str
    fields: dict[str, Any]
    event_suffix: str  # the event message is the command type followed by this
    event_data: dict[str, Any]

    @classmethod
    def ack(cls, node_id: uuid.UUID, command_id: Any, *, duplicate: bool = False) -> CommandReport:
        note = " (already done before: duplicate delivery)" if duplicate else ""
        return cls(node_id, command_id, CommandStatus.RUNNING, {}, f" started{note}", {})

    @classmethod
    def result(cls, node_id: uuid.UUID, command_id: Any, data: dict[str, Any]) -> CommandReport:
        return cls(node_id, command_id, CommandStatus.SUCCEEDED, {"result": data}, " succeeded", data)

    @classmethod
    def error(
        cls, node_id: uuid.UUID, command_id: Any, *, code: str, message: str, data: dict[str, Any] | None = None
    ) -> CommandReport:
        fields = {"error_code": code[:64], "error_message": message[:4000], "result": data or {}}
        return cls(node_id, command_id, CommandStatus.FAILED, fields, f" failed: {code}: {message[:500]}", data or {})


_REPORT_COLUMNS = {
    CommandStatus.RUNNING: ["status", "acked_at"],
    CommandStatus.SUCCEEDED: ["status", "finished_at", "result"],
    CommandStatus.FAILED: ["status", "finished_at", "error_code", "error_message", "result"],
}


def command_record_reports(*, reports: list[CommandReport]) -> list[Command | Exception | None]:
    """Record many agents' reports at once, in one transaction: the batched form of the three above.

    For tunnels that report at the same moment (a fan-out to All nodes): one locking SELECT, one
    UPDATE per kind of report and one INSERT of events for the whole batch, then each command's
    follow-up hooks. Per report the same outcome as its single form: the updated Command, None
    (unknown, another node's command, or already in that state), or the exception the single form
    raises (IllegalTransition, ValidationError) — returned, not raised, so one bad report never fails
    the others. Reports are applied in order, so an ack and a result of one command may share a batch.
    """
    outcomes: list[Command | Exception | None] = [None] * len(reports)
    wanted: dict[int, uuid.UUID] = {}
    for i, report in enumerate(reports):
        try:
            wanted[i] = uuid.UUID(str(report.command_id))
        except (ValueError, TypeError):
            outcomes[i] = ValidationError({"command_id": "Must be a UUID."})
    if not wanted:
        return outcomes
    with transaction.atomic():
        ids = set(wanted.values())
        rows = {c.pk: c for c in Command.objects.select_for_update().filter(pk__in=ids).order_by("pk")}
        now = timezone.now()
        changed: dict[str, dict[uuid.UUID, Command]] = {to: {} for to in _REPORT_COLUMNS}
        moves: list[tuple[CommandReport, Command]] = []
        for i, command_id in wanted.items():
            report = reports[i]
            command = rows.get(command_id)
            if command is None or command.node_id != report.node_id:
                logger.warning(
                    "node %s reported on command %s that is not its own; ignored", report.node_id, command_id
                )
            elif command.status == report.to:
                pass  # a duplicate report: nothing changes
            elif command.status not in _COMMAND_MOVES[report.to]:
                outcomes[i] = IllegalTransition(f"A {command.status} command cannot become {report.to}.")
            else:
                command.status = report.to
                setattr(command, _COMMAND_TIMESTAMP[report.to], now)
                for name, value in report.fields.items():
                    setattr(command, name, value)
                changed[report.to][command.pk] = command
                moves.append((report, command))
                outcomes[i] = command
        for to, commands in changed.items():
            if commands:
                Command.objects.bulk_update(list(commands.values()), _REPORT_COLUMNS[to])
        NodeEvent.objects.bulk_create(
            [
                NodeEvent(
                    node_id=command.node_id,
                    kind=f"command.{report.to}",
                    message=command.command_type + report.event_suffix,
                    data=report.event_data,
                    command=command,
                )
                for report, command in moves
            ]
        )
        _audit_follow(moves)
        for report, command in moves:
            if report.to == CommandStatus.RUNNING:
                _after_command_acked(command)
            else:
                _after_command_finished(command)
    for report, command in moves:
        if report.to == CommandStatus.RUNNING and command.dispatched_at is not None:
            latency = (command.acked_at - command.dispatched_at).total_seconds()
            metrics.COMMAND_ACK_SECONDS.labels(type=command.command_type).observe(max(0.0, latency))
    return outcomes


def _audit_follow(moves: list[tuple[CommandReport, Command]]) -> None:
    """Settle the audit entries of the operator actions whose commands just finished: one query to
    count their commands by status, one UPDATE per entry; nothing for commands no action sent."""
    finished = [(r, c) for r, c in moves if c.audit_entry_id and r.to != CommandStatus.RUNNING]
    if not finished:
        return
    entries = {c.audit_entry_id for _, c in finished}
    open_ = set(
        Command.objects.filter(audit_entry_id__in=entries)
        .exclude(status__in=[CommandStatus.SUCCEEDED, CommandStatus.FAILED])
        .values_list("audit_entry_id", flat=True)
        .distinct()
    )
    for entry_id in entries:
        mine = [c for _, c in finished if c.audit_entry_id == entry_id]
        failure = next(
            (
                f"{c.command_type} failed: {c.error_code}: {c.error_message}"
                for c in mine
                if c.status == CommandStatus.FAILED
            ),
            "",
        )
        commit = next(
            (str(c.result["commit"]) for c in mine if isinstance(c.result, dict) and c.result.get("commit")), ""
        )
        entry_settle(entry_id=entry_id, failure=failure, done=entry_id not in open_, git_commit=commit)


def _record_one(report: CommandReport) -> Command | None:
    outcome = command_record_reports(reports=[report])[0]
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


# --------------------------------------------------------------------------------------------------
# Namespaces


def _namespace_cluster(workspace: Workspace, cluster_id: Any) -> ComputeCluster | None:
    if cluster_id in (None, ""):
        return None
    pk = _parse_uuid(cluster_id, "cluster")
    cluster = ComputeCluster.objects.filter(pk=pk, workspace=workspace).first()
    if cluster is None:
        raise ValidationError({"cluster": "No such cluster in this workspace."})
    return cluster


@operator_action(
    "namespace.create",
    target=new("namespace"),
    result=created("namespace"),
    detail=lambda kw, _: {"cluster": str(kw["cluster_id"]) if kw.get("cluster_id") else None},
)
def namespace_create(*, actor: AbstractBaseUser, workspace: Workspace, name: str, cluster_id: Any = None) -> Namespace:
    """Create a namespace in `workspace`, optionally bound to one of its clusters."""
    _require_operator(actor, workspace)
    namespace = Namespace(workspace=workspace, name=name, cluster=_namespace_cluster(workspace, cluster_id))
    _full_clean(namespace, exclude=["workspace", "cluster"])
    try:
        with transaction.atomic():
            namespace.save()
    except IntegrityError:
        raise ValidationError({"name": "A namespace with this name already exists in the workspace."}) from None
    return namespace


@operator_action(
    "namespace.bind",
    target=on("namespace", "namespace"),
    detail=lambda kw, _: {"cluster": str(kw["cluster_id"]) if kw.get("cluster_id") else None},
)
def namespace_bind(*, actor: AbstractBaseUser, namespace: Namespace, cluster_id: Any) -> Namespace:
    """Bind a namespace to a cluster of its workspace (None unbinds)."""
    _require_operator(actor, namespace.workspace)
    namespace.cluster = _namespace_cluster(namespace.workspace, cluster_id)
    namespace.save(update_fields=["cluster"])
    return namespace


@operator_action("namespace.delete", target=on("namespace", "namespace"))
def namespace_delete(*, actor: AbstractBaseUser, namespace: Namespace) -> None:
    """Delete a namespace."""
    _require_operator(actor, namespace.workspace)
    namespace.delete()

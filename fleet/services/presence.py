"""Node presence, as the tunnel consumer reports it: connected, refused, disconnected, heartbeats.

Also the lost-nodes pass (offline after the grace or a heartbeat silence), the partition pause it may
start, and the operator's early end of that pause.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import uuid
from typing import Any

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import models, transaction
from django.db.models import Count
from django.utils import timezone

from agent import protocol
from audit.services import on, operator_action
from fleet import browser_push, enqueue, groups, metrics_history, node_problems, signals
from fleet.models import ClusterEvent, ComputeCluster, Node, NodeEvent, NodeStatus
from fleet.services.common import gpu_fields, host_fact_fields, host_facts_parse
from fleet.services.events import node_event_record
from tenancy.mixins import require_operator

logger = logging.getLogger(__name__)


def node_record_inventory(*, node: Node, inventory: protocol.Inventory, from_hello: bool = False) -> Node:
    """Store the node's inventory and reconcile containers, cached models and endpoints from it.

    The reconcile sets `containers_count` (active containers) and takes a drain's next step. A blank
    inventory in a Hello (what an agent process sends before it knows its cluster's mode) says nothing
    about problems: the stored ones stay until the agent's inventory report right after (`from_hello`).
    """
    data = protocol.to_dict(inventory)
    if from_hello and inventory.blank and isinstance(node.inventory, dict) and node.inventory.get("problems"):
        data["problems"] = node.inventory["problems"]
    fields: dict[str, Any] = {"inventory": data}
    if inventory.gpus:
        fields.update(gpu_fields(inventory.gpus))
    with transaction.atomic():
        before = node_problems.problem_kinds(node.inventory)
        Node.objects.filter(pk=node.pk).update(**fields)
        signals.inventory_received.send(sender=Node, node=node, inventory=inventory)
        node.refresh_from_db()
        _record_problem_events(node, before)
    return node


def _record_problem_events(node: Node, before: set[tuple[str, str]]) -> None:
    """An event for each problem the agent newly reports (with its fix) and one when they are all gone."""
    now = node_problems.problem_kinds(node.inventory)
    for problem in node_problems.node_problems(node):
        if (problem.part, problem.code) not in before:
            node_event_record(
                node_id=node.pk,
                kind="agent.problem",
                message=f"{problem.title} The agent says: {problem.message.rstrip('.')}. {problem.fix}",
                data={"part": problem.part, "code": problem.code},
            )
    if before and not now:
        node_event_record(
            node_id=node.pk, kind="agent.problem_resolved", message="The agent reads its inventory again."
        )


@transaction.atomic
def node_connected(
    *,
    node: Node,
    facts: protocol.HostFacts,
    inventory: protocol.Inventory,
    inbox: str = "",
    peer: str = "",
    session: uuid.UUID | None = None,
    protocol_version: int = protocol.PROTOCOL_VERSION,
) -> None:
    """The node's agent authenticated on a tunnel: connected, offline → online, facts and inventory stored.

    `inbox` is the channel-layer inbox of the process holding the tunnel (`fleet.tunnel.local_tunnels`),
    `peer` its peer address, where other processes open proxied streams (`fleet.tunnel.peer_listener`);
    `session` names this tunnel (a fresh id per socket) so that only its own close disconnects the node;
    `protocol_version` is the tunnel's. An agent one protocol version behind gets an event asking for its
    update. Call it before `command_pending_for_node` so no command queued meanwhile is missed.
    """
    now = timezone.now()
    fields = host_fact_fields(host_facts_parse(facts))
    Node.objects.filter(pk=node.pk).update(
        connected=True,
        tunnel_inbox=inbox,
        tunnel_peer=peer,
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
    node_record_inventory(node=node, inventory=inventory, from_hello=True)
    browser_push.node_changed(node=node)
    message = "Agent connected" + ("; status → online" if became_online else f" (status stays {node.status})")
    node_event_record(
        node_id=node.pk,
        kind="connected",
        message=message,
        data={"agent_version": facts.agent_version, "protocol": protocol_version},
    )
    if protocol_version < protocol.PROTOCOL_VERSION:
        node_event_record(
            node_id=node.pk,
            kind="agent.outdated",
            message=f"The agent speaks protocol {protocol_version}, one version behind this control plane "
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
        node_event_record(
            node_id=node_id,
            kind="agent.too_old",
            message=message,
            data={"protocol": protocol_version, "accepted": list(accepted)},
        )
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
    was_connected = rows.filter(connected=True).exists()  # (the lost-nodes pass may have cleared it already)
    if not rows.update(connected=False, tunnel_inbox="", tunnel_peer="", disconnected_at=timezone.now()):
        return  # a deleted node, or a newer tunnel holds it: no event
    grace = settings.NODE_OFFLINE_GRACE_S
    online = Node.objects.filter(pk=node.pk, status=NodeStatus.ONLINE).exists()
    suffix = f"; offline in {grace} s unless it reconnects" if online else ""
    node_event_record(node_id=node.pk, kind="disconnected", message=f"Agent disconnected (tunnel closed){suffix}")
    if was_connected:  # the pages show "reconnecting…" or when it was last seen
        browser_push.node_changed(node=node)
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
        gpu = gpu_fields(beat.gpus) if beat.gpus else None
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
        browser_push.node_ids_changed(node_ids=came_back)
    known = {str(node_id) for node_id, _, _ in rows}
    metrics_history.record([_sample(node_id, beat) for node_id, beat in beats if str(node_id) in known])
    return {node_id for node_id, connected, _ in rows if not connected}


def _sample(node_id: uuid.UUID | str, beat: protocol.Heartbeat) -> metrics_history.Sample:
    """A heartbeat as a point of the node's utilization history (VRAM as a share of the GPUs' memory)."""
    gpu = gpu_fields(beat.gpus) if beat.gpus else None
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
        browser_push.node_ids_changed(node_ids=[row[0] for row in rows])  # offline, or no longer connected
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
    require_operator(actor, cluster.workspace)
    ComputeCluster.objects.filter(pk=cluster.pk).update(automation_paused_until=None)
    ClusterEvent.objects.create(
        cluster=cluster, kind="automation.resumed", message=f"Automation resumed by {actor.get_username()}"
    )
    cluster.refresh_from_db()
    return cluster

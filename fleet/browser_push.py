"""Tell signed-in browsers at once that nodes changed, so their open pages refresh what shows them.

One channel-layer group per workspace (`workspace_group`). The browser socket of every signed-in tab
(`cleverthis.consumers.LiveConsumer` at `/ws/live/`, on the user-session stack, never on the agent
tunnel path) joins the groups of the user's workspaces. A node's status or presence change (online,
offline, cordoned, draining, disconnected, deleted) calls `nodes_changed` inside its transaction; after
the commit one small message per workspace goes out, naming the nodes and their clusters (ids only: what
a page shows is re-read by its own view, with the reader's permissions). A page that shows one of them
asks for just that part again (`static/js/push.js`). A member removed from a workspace stops hearing it at
once: the removal tells the tabs of that user (`user_group`) to leave the workspace's group, and a tab
drops any message of a workspace it has left.

Cost: one `group_send` per workspace per change (a pass that takes many nodes offline at once is still
one per workspace), one frame per open tab of that workspace's members, one GET per tab showing an
affected node. A failed send is logged and never fails the change: the pages' own polls still come.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import DatabaseError, transaction

from fleet.models import ComputeCluster, Node

logger = logging.getLogger(__name__)

BROWSER_NODES = "browser.nodes"  # the consumer's `browser_nodes` handler
MAX_IDS = 200  # a message names at most this many nodes; more: the clusters alone (pages refresh whole)

Change = tuple[uuid.UUID | str, uuid.UUID | str, Any]  # (node id, cluster id, workspace id)


BROWSER_LEAVE = "browser.leave"  # the consumer's `browser_leave` handler


def user_group(user_id: Any) -> str:
    """The channel-layer group of one user's open tabs (told when they leave a workspace)."""
    return f"browsers.user.{user_id}"


def member_removed(*, workspace: Any, user: Any, **_: Any) -> None:
    """After the commit, tell the removed member's open tabs to leave the workspace's group at once
    (`tenancy.signals.membership_removed`), rather than at their next renew."""
    message = {"type": BROWSER_LEAVE, "workspace": str(workspace.pk)}
    transaction.on_commit(lambda: _send([(user_group(user.pk), message)]))


def workspace_group(workspace_id: Any) -> str:
    """The channel-layer group of the browsers of one workspace's members."""
    return f"browsers.ws.{workspace_id}"


def nodes_message(*, workspace_id: Any, node_ids: Iterable[Any], cluster_ids: Iterable[Any]) -> dict[str, Any]:
    """The message a workspace's browsers get: which nodes (and clusters) changed."""
    nodes = sorted({str(n) for n in node_ids})
    return {
        "type": BROWSER_NODES,
        "workspace": str(workspace_id),
        "nodes": nodes if len(nodes) <= MAX_IDS else [],
        "clusters": sorted({str(c) for c in cluster_ids}),
    }


def nodes_changed(*, changes: Iterable[Change]) -> None:
    """After the commit (at once outside a transaction), tell each workspace's browsers which nodes changed."""
    messages = _messages(changes)
    if messages:
        transaction.on_commit(lambda: _send(messages))


def _messages(changes: Iterable[Change]) -> list[tuple[str, dict[str, Any]]]:
    """One (group, message) per workspace among `changes`."""
    grouped: dict[Any, tuple[set[str], set[str]]] = {}
    for node_id, cluster_id, workspace_id in changes:
        nodes, clusters = grouped.setdefault(workspace_id, (set(), set()))
        nodes.add(str(node_id))
        clusters.add(str(cluster_id))
    return [
        (workspace_group(ws), nodes_message(workspace_id=ws, node_ids=nodes, cluster_ids=clusters))
        for ws, (nodes, clusters) in grouped.items()
    ]


def node_changed(*, node: Node) -> None:
    """`nodes_changed` for one node (its workspace read from the loaded cluster, else one query)."""
    if Node.cluster.is_cached(node):
        workspace_id = node.cluster.workspace_id
    else:
        workspace_id = ComputeCluster.objects.filter(pk=node.cluster_id).values_list("workspace_id", flat=True).first()
    if workspace_id is not None:
        nodes_changed(changes=[(node.pk, node.cluster_id, workspace_id)])


def node_ids_changed(*, node_ids: Iterable[Any]) -> None:
    """`nodes_changed` for nodes known by id only: their clusters and workspaces are read after the commit
    (one query then, none in the caller's transaction: the heartbeat and lost-node passes stay as they were)."""
    ids = list(node_ids)
    if ids:
        transaction.on_commit(lambda: _send_for_ids(ids))


def _send_for_ids(node_ids: list[Any]) -> None:
    try:
        changes = list(Node.objects.filter(pk__in=node_ids).values_list("pk", "cluster_id", "cluster__workspace_id"))
    except DatabaseError as exc:  # after the commit: never fail the caller for it
        logger.warning("telling browsers about %d changed nodes failed: %s", len(node_ids), exc)
        return
    _send(_messages(changes))


def _send(messages: list[tuple[str, dict[str, Any]]]) -> None:
    layer = get_channel_layer()
    if layer is None or not messages:  # (CHANNEL_LAYERS is always configured)
        return

    async def send_all() -> None:
        for group, message in messages:
            await layer.group_send(group, message)

    try:
        async_to_sync(send_all)()
    except Exception as exc:  # the pages' own polls still show the change
        logger.warning("telling browsers about %d workspace(s) of changed nodes failed: %s", len(messages), exc)

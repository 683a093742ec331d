"""The node state machine: rename, cordon, uncordon, drain (and its end), delete.

One service per transition, each a conditional UPDATE from the states it accepts, so concurrent
changes cannot both win.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from audit.services import on, operator_action
from fleet import browser_push, groups, metrics_history, signals
from fleet.models import Node, NodeCertificate, NodeStatus, RevokedSerial
from fleet.services.events import node_event_record
from kernel.exceptions import IllegalTransition
from tenancy.mixins import require_operator


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
    node_event_record(node_id=node.pk, kind=event, message=f"Status → {to}")
    node.refresh_from_db()
    browser_push.node_changed(node=node)
    return node


@operator_action("node.rename", target=on("node", "node"), detail=lambda kw, _: {"name": str(kw.get("name"))[:100]})
def node_rename(*, node: Node, actor: AbstractBaseUser, name: str) -> Node:
    """Give a node a display name (defaults to its hostname)."""
    require_operator(actor, node.cluster.workspace)
    if not isinstance(name, str) or not name.strip():
        raise ValidationError({"name": "A name is required."})
    name = name.strip()
    if len(name) > 100:
        raise ValidationError({"name": "At most 100 characters."})
    old = node.name
    Node.objects.filter(pk=node.pk).update(name=name)
    node.name = name
    node_event_record(node_id=node.pk, kind="renamed", message=f"Renamed from {old} to {name}")
    browser_push.node_changed(node=node)
    return node


@operator_action("node.cordon", target=on("node", "node"))
def node_cordon(*, node: Node, actor: AbstractBaseUser) -> Node:
    """online/offline → cordoned: no new workloads are scheduled on the node."""
    require_operator(actor, node.cluster.workspace)
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
    require_operator(actor, node.cluster.workspace)
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
    """online/cordoned → draining (→ cordoned at once when it runs no containers).

    A node with containers left asks for a drain pass with `fleet.signals.drain_requested`; the workloads
    (`fleet.workloads.receivers`) take it.
    """
    require_operator(actor, node.cluster.workspace)
    node = _transition_node(
        node,
        to=NodeStatus.DRAINING,
        allowed_from=[NodeStatus.ONLINE, NodeStatus.CORDONED],
        refusal="Cannot drain a node that is {status}.",
        event="draining",
    )
    if node.containers_count == 0:
        return node_finish_drain(node=node)
    signals.drain_requested.send(sender=Node, node=node)
    return node


def node_finish_drain(*, node: Node) -> Node:
    """draining → cordoned once no container is left on the node (the drain's last step); else unchanged."""
    updated = Node.objects.filter(pk=node.pk, status=NodeStatus.DRAINING, containers_count=0).update(
        status=NodeStatus.CORDONED, status_changed_at=timezone.now()
    )
    if updated:
        node_event_record(
            node_id=node.pk, kind="drained", message="Drain finished: no containers left on the node; status → cordoned"
        )
        node.refresh_from_db()
        browser_push.node_changed(node=node)
    return node


def node_purge(*, node: Node) -> None:
    """Delete a node, its certificates' serials revoked and its live tunnel closed after commit. No
    permission check and no audit entry of its own: `node_delete` and `cluster_delete` are the callers."""
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
    reachable = Node.objects.filter(pk=node_id, connected=True).exists()
    signals.node_deleting.send(sender=Node, node=node, reachable=reachable)
    browser_push.node_changed(node=node)  # (sent after the commit: the open pages drop its row)
    Node.objects.filter(pk=node_id).delete()
    transaction.on_commit(lambda: groups.send_to_node(node_id, groups.revoke_message("node deleted")))
    transaction.on_commit(lambda: metrics_history.forget(node_id))


@operator_action("node.delete", target=on("node", "node"))
def node_delete(*, node: Node, actor: AbstractBaseUser) -> None:
    """Delete a node: its certificate serials go on the revocation list and its live tunnel is closed."""
    require_operator(actor, node.cluster.workspace)
    node_purge(node=node)

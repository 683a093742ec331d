"""The Ray cluster state machine (`ray_cluster_transition`, the only writer of `RayCluster.status`) and Ray
node status writes."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from kernel.exceptions import IllegalTransition
from raymgr.models import RayCluster, RayNode
from raymgr.services.common import S, record_event

TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.RUNNING, S.FAILED, S.STOPPED, S.DELETING}),
    S.RUNNING: frozenset({S.FAILED, S.STOPPED, S.DELETING}),
    S.FAILED: frozenset({S.PENDING, S.STOPPED, S.DELETING}),
    S.STOPPED: frozenset({S.PENDING, S.DELETING}),
    S.DELETING: frozenset(),
}


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
    record_event(cluster, "status", f"Status → {to}" + (f": {reason}" if reason else ""), status=to)
    cluster.refresh_from_db()
    return cluster


def ray_node_set_status(ray_node: RayNode, to: str, **fields: Any) -> None:
    """Set a Ray node's status (stamping `status_changed_at`) and other fields, in the row and on `ray_node`."""
    RayNode.objects.filter(pk=ray_node.pk).update(status=to, status_changed_at=timezone.now(), **fields)
    ray_node.status = to
    for name, value in fields.items():
        setattr(ray_node, name, value)

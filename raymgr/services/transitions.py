"""The Ray cluster state machine (`ray_cluster_transition`, the only writer of `RayCluster.status`) and Ray
node status writes."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django.utils import timezone

from kernel.exceptions import IllegalTransition
from raymgr.models import RayCluster, RayNode
from raymgr.services.common import S, record_event

TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.RUNNING, S.FAILED, S.STOPPING, S.DELETING}),
    S.RUNNING: frozenset({S.FAILED, S.STOPPING, S.DELETING}),
    S.FAILED: frozenset({S.PENDING, S.STOPPING, S.DELETING}),
    # stopping → stopped once every Ray node's stop has finished (containers/processes gone)
    S.STOPPING: frozenset({S.STOPPED, S.DELETING}),
    # stopped → stopping: a Ray node whose start won the race with its stop is being stopped again
    S.STOPPED: frozenset({S.PENDING, S.STOPPING, S.DELETING}),
    S.DELETING: frozenset(),
}
# Refusals that deserve more than "A <state> Ray cluster cannot become <state>": (current, wanted) → message.
REFUSALS: dict[tuple[str, str], str] = {
    (S.STOPPING, S.PENDING): "This Ray cluster is still stopping: wait until it has stopped, then start it.",
}


def ray_cluster_transition(
    *, cluster: RayCluster, to: str, reason: str = "", from_states: Collection[str] | None = None, **fields: Any
) -> RayCluster:
    """Move `cluster` to `to` with a conditional UPDATE; `IllegalTransition` (HTTP 409) if not allowed.

    `from_states` narrows the states it may leave (an operator's Stop never restarts a stopped cluster's
    stop, which a Ray node started after its stop does).

    Stamps `status_changed_at`, stores `reason` as the failure reason when failing (clears it otherwise),
    records a `status` event and refreshes `cluster`.
    """
    if to not in TRANSITIONS:
        raise ValueError(f"unknown Ray cluster status {to!r}")
    allowed_from = [
        state
        for state, targets in TRANSITIONS.items()
        if to in targets and (from_states is None or state in from_states)
    ]
    fields["failure_reason"] = reason if to == S.FAILED else ""
    updated = RayCluster.objects.filter(pk=cluster.pk, status__in=allowed_from).update(
        status=to, status_changed_at=timezone.now(), **fields
    )
    if updated != 1:
        current = RayCluster.objects.filter(pk=cluster.pk).values_list("status", flat=True).first()
        if current is None:
            raise IllegalTransition("This Ray cluster no longer exists.")
        raise IllegalTransition(REFUSALS.get((current, to), f"A {current} Ray cluster cannot become {to}."))
    record_event(cluster, "status", f"Status → {to}" + (f": {reason}" if reason else ""), status=to)
    cluster.refresh_from_db()
    return cluster


def ray_node_set_status(ray_node: RayNode, to: str, **fields: Any) -> None:
    """Set a Ray node's status (stamping `status_changed_at`) and other fields, in the row and on `ray_node`."""
    RayNode.objects.filter(pk=ray_node.pk).update(status=to, status_changed_at=timezone.now(), **fields)
    ray_node.status = to
    for name, value in fields.items():
        setattr(ray_node, name, value)

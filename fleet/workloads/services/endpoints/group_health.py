"""A distributed endpoint fails, moves and heals as one unit (the healing pass of `heal` hands groups here).

One pass over a group (`group_heal`, under the endpoint's lock):

- a rank is lost when its Ray node no longer runs (its container killed: raymgr marks it failed), its fleet
  node is offline, its server went away or stopped answering, or it failed to start: the group fails with
  that reason on the endpoint's event log (`endpoint.group_failed`) and every other live rank is told to stop
  (a pipeline missing a stage serves nothing);
- a rank on a draining node makes the group move: it stops (`endpoint.group_moving`) and starts again once its
  Ray cluster runs whole off that node (the Ray autoscaler never removes a worker a rank uses, so the Ray
  cluster only changes by a drain, a failure or an operator);
- a group failed by a loss (not by a start failure: it would fail again) starts again, all ranks, once its Ray
  cluster is whole and running and no rank is live nor has a stop still on its way (`endpoint.group_restarted`),
  its followers joining the leader on another port than last time; a rank whose stop waits on its offline node
  holds the group back only when placed on that node again: placed on another (the Ray cluster replaced its
  worker there), a fresh rank starts there and the old one's stop stays queued, ending its server when the node
  returns (`groups.rank_left_behind`).
"""

from __future__ import annotations

import logging

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction

from fleet.models import NodeStatus
from fleet.workloads.groups import group_source
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.services.endpoints.events import endpoint_event_record
from fleet.workloads.services.endpoints.groups import (
    current_ranks,
    group_plan,
    group_start,
    rank_left_behind,
    rank_settled,
)
from fleet.workloads.services.endpoints.placement import PlacementError
from fleet.workloads.services.endpoints.reconcile import UNRESPONSIVE
from fleet.workloads.services.endpoints.replicas import endpoint_summarise, replica_queue_stop
from kernel.exceptions import IllegalTransition, QuotaExceeded

log = logging.getLogger(__name__)

LOST = "group_member_lost"  # a rank or its Ray node died: healed once the Ray cluster is whole again
MOVING = "group_moving"  # a rank's node drains: started again off it
START_FAILED = "group_start_failed"  # a rank failed to start: not healed (it would fail again)
HEALED = frozenset({LOST, MOVING})
_LIVE = frozenset({EndpointStatus.PENDING, EndpointStatus.STARTING, EndpointStatus.RUNNING})
# A rank's failures that say it was lost while it ran (its server gone, hung, its node deleted unreachable); any
# other code is its start's error.
_LOSSES = frozenset({"", "not_found", UNRESPONSIVE, "node_lost"})


def _why_lost(rank: EndpointReplica) -> tuple[str, str]:
    """(code, why) when this rank takes the group down, else ("", "")."""
    where = f"rank {rank.group_rank} ({rank.group_role}) on node {rank.node.name if rank.node else '(deleted)'}"
    if rank.status in _LIVE and (rank.node is None or rank.node.status == NodeStatus.OFFLINE):
        return LOST, f"{where}: the node is offline"
    if rank.status in _LIVE and rank.node.status == NodeStatus.DRAINING:
        return MOVING, f"{where}: the node is draining; the group starts again off it"
    if rank.status == EndpointStatus.FAILED:
        reason = f"{rank.failure_code}: {rank.failure_message}" if rank.failure_code else rank.failure_message
        code = LOST if rank.failure_code in _LOSSES else START_FAILED
        return code, f"{where} failed ({reason or 'its server exited'})"
    return "", ""


def _may_restart(endpoint: Endpoint, ranks: list[EndpointReplica]) -> bool:
    """Every rank settled (`rank_settled`), or each one not yet settled placed on another node by the Ray
    cluster as it runs now (`rank_left_behind`: it need not wait for its stop)."""
    waiting = [r for r in ranks if not rank_settled(r)]
    if not waiting:
        return True
    try:
        members = group_plan(endpoint=endpoint).members
    except ValidationError:  # not whole yet: the start would be refused anyway
        return False
    return all(r.group_rank < len(members) and rank_left_behind(r, members[r.group_rank]) for r in waiting)


def group_heal(*, actor: AbstractBaseUser, endpoint: Endpoint) -> list[EndpointReplica]:
    """One pass over a distributed endpoint (see the module; the caller holds its lock); the ranks started."""
    ranks = list(
        EndpointReplica.objects.select_for_update(of=("self",))
        .select_related("node", "stop_command")
        .filter(endpoint=endpoint, group_rank__lt=endpoint.pipeline_parallel, replacements__isnull=True)
        .order_by("group_rank")
    )
    if not endpoint.group_failure_code and endpoint.status not in (EndpointStatus.STOPPING, EndpointStatus.STOPPED):
        code, why = _group_lost(endpoint, ranks)
        if code:
            _fail(actor=actor, endpoint=endpoint, ranks=ranks, code=code, why=why)
            return []
    if endpoint.group_failure_code in HEALED and _may_restart(endpoint, ranks):
        return _restart(actor=actor, endpoint=endpoint)
    endpoint_summarise(endpoint)
    return []


def _group_lost(endpoint: Endpoint, ranks: list[EndpointReplica]) -> tuple[str, str]:
    """(code, why) the group must come down now, else ("", ""): every rank seen lost is named (a follower's
    death is often seen first as its leader's probe failing)."""
    lost = [found for rank in ranks if (found := _why_lost(rank))[0]]
    if lost:
        codes = {code for code, _ in lost}
        code = START_FAILED if START_FAILED in codes else (MOVING if codes == {MOVING} else LOST)
        return code, "; ".join(why for _, why in lost)
    live = [r for r in ranks if r.status in _LIVE and r.ray_node]
    if live and endpoint.status != EndpointStatus.PENDING:
        why = group_source().lost(ray_nodes=[r.ray_node for r in live])
        if why:
            return LOST, why
    return "", ""


def _fail(*, actor: AbstractBaseUser, endpoint: Endpoint, ranks: list[EndpointReplica], code: str, why: str) -> None:
    """The group comes down: its reason kept on the endpoint, every live rank told to stop."""
    endpoint.group_failure_code, endpoint.group_failure = code, why
    endpoint.save(update_fields=["group_failure_code", "group_failure", "updated_at"])
    stopped, queued = [], []
    for rank in ranks:
        if rank.status in _LIVE and rank.node is not None:
            replica_queue_stop(actor=actor, endpoint=endpoint, replica=rank)
            stopped.append(rank.group_rank)
            if rank.node.status == NodeStatus.OFFLINE:
                queued.append(f"rank {rank.group_rank}'s stop waits for node {rank.node.name} to come back")
    kind = "endpoint.group_moving" if code == MOVING else "endpoint.group_failed"
    then = (
        "it is not started again by itself (a new start would fail alike)"
        if code not in HEALED
        else "it starts again when its Ray cluster is whole, without waiting for that stop where the Ray cluster "
        "places the rank on another node"
        if queued
        else "it starts again when its Ray cluster is whole"
    )
    waits = f" ({'; '.join(queued)})" if queued else ""
    endpoint_event_record(
        endpoint=endpoint,
        node_id=endpoint.node_id,
        kind=kind,
        message=f"Endpoint {endpoint.hostname}: the group is down: {why}; ranks {stopped or 'none'} told to stop"
        f"{waits}; {then}",
        data={"reason": why, "code": code, "stopped_ranks": stopped},
    )
    endpoint_summarise(endpoint)


def _restart(*, actor: AbstractBaseUser, endpoint: Endpoint) -> list[EndpointReplica]:
    """Start every rank again where the Ray cluster now runs, or leave it failed until the next pass."""
    before = endpoint.group_failure
    kept = {r.pk for r in current_ranks(endpoint).values()}  # a rank started under a new row moved off its node
    try:
        with transaction.atomic():  # a savepoint: a group the checks or quotas refuse leaves nothing
            commands = group_start(actor=actor, endpoint=endpoint)
    except (ValidationError, PlacementError, IllegalTransition, QuotaExceeded) as exc:
        log.info("endpoint %s: the group cannot start again yet: %s", endpoint.slug, exc)
        endpoint.refresh_from_db()
        return []
    started = list(
        endpoint.replicas.select_related("node", "replacement_of__node")
        .filter(start_command__in=commands)
        .order_by("group_rank")
    )
    moved = [r for r in started if r.pk not in kept and r.replacement_of is not None]
    words = [f"; {_moved_words(r, r.replacement_of)}" for r in moved]
    endpoint_event_record(
        endpoint=endpoint,
        node_id=commands[0].node_id,
        kind="endpoint.group_restarted",
        message=f"Endpoint {endpoint.hostname}: its Ray cluster is whole again; all {len(commands)} ranks "
        f"started again{''.join(words)} (the group was down: {before})",
        data={"moved_ranks": [r.group_rank for r in moved]},
        command=commands[0],
    )
    endpoint_summarise(endpoint)
    return started


def _moved_words(rank: EndpointReplica, old: EndpointReplica) -> str:
    """How a rank left its old one behind, in words: where each runs and what becomes of the old server."""
    where = old.node.name if old.node else "(deleted)"
    fate = (
        f"its stop stays queued and ends it when {where} comes back"
        if old.node is not None and old.node.status == NodeStatus.OFFLINE
        else "its stop is still on its way"
    )
    return (
        f"rank {rank.group_rank} moved from node {where} to {rank.node.name} as server {rank.server_id} without "
        f"waiting for its old server {old.server_id} there ({fate})"
    )

"""Keeping an endpoint's replicas: one lost with its node (offline), whose server went away (the agent no
longer runs it) or hangs (the agent's health probes failed: failed "unresponsive", its server already told to
stop by `endpoints_reconcile`) is replaced by a new replica placed like the others, and the lost one leaves
rotation; one on a draining node is replaced too, but keeps serving until its replacement runs, then leaves
rotation and is stopped ENDPOINT_DRAIN_S later (the drain waits for it: `fleet.workloads.drain`). The same
pass stops the replicas a rolling update (`endpoint_update`) replaced, and those taken out of rotation
(`replica_retire`: scaled down or to zero) once they have drained as long; a retired replica is never replaced.

`endpoint_heal` is one idempotent pass over an endpoint, run for every endpoint that should run by the beat
(`fleet.workloads.tasks.endpoints_heal_tick`). A lost replica still live is told to stop (its command waits
for the node's return: the server must not outlive its replacement unseen); a replica that failed to start
is not replaced (it would fail again), nor is a stopping or stopped endpoint healed (but a distributed one
down by a loss, which stays stopping while a rank's stop waits on its offline node: `group_health`).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from fleet.models import NodeStatus
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.services.common import system_actor
from fleet.workloads.services.endpoints.events import endpoint_event_record
from fleet.workloads.services.endpoints.group_health import HEALED, START_FAILED, group_heal
from fleet.workloads.services.endpoints.locking import lock_endpoint
from fleet.workloads.services.endpoints.placement import PlacementError, pick_replica_node
from fleet.workloads.services.endpoints.reconcile import UNRESPONSIVE
from fleet.workloads.services.endpoints.replicas import endpoint_summarise, replica_queue_start, replica_queue_stop
from kernel.exceptions import QuotaExceeded

log = logging.getLogger(__name__)

_LIVE = frozenset({EndpointStatus.PENDING, EndpointStatus.STARTING, EndpointStatus.RUNNING})


def replica_lost(replica: EndpointReplica) -> str:
    """Why `replica` needs a replacement ("" when it does not)."""
    if replica.status in _LIVE and (replica.node is None or replica.node.status == NodeStatus.OFFLINE):
        return f"node {replica.node.name if replica.node else '(deleted)'} is offline"
    if replica.status in _LIVE and replica.node.status == NodeStatus.DRAINING:
        return f"node {replica.node.name} is draining"
    if replica.status == EndpointStatus.FAILED and replica.failure_code == "not_found":
        return "its server is gone from its node"
    if replica.status == EndpointStatus.FAILED and replica.failure_code == UNRESPONSIVE:
        return "its server stopped answering health checks"
    return ""


def endpoints_to_heal() -> list[object]:
    """Ids of the endpoints that should run and have a current replica lost (what the beat passes over)."""
    current = EndpointReplica.objects.filter(replacements__isnull=True, retired_at__isnull=True).exclude(
        endpoint__status__in=[EndpointStatus.STOPPING, EndpointStatus.STOPPED]
    )
    moving = current.filter(status__in=_LIVE, node__status__in=[NodeStatus.OFFLINE, NodeStatus.DRAINING])
    gone = current.filter(status=EndpointStatus.FAILED, failure_code__in=["not_found", UNRESPONSIVE])
    handed_over = EndpointReplica.objects.filter(status__in=_LIVE, replacements__status=EndpointStatus.RUNNING)
    drained = timezone.now() - timedelta(seconds=settings.ENDPOINT_DRAIN_S)
    retired = EndpointReplica.objects.filter(status__in=_LIVE, retired_at__lte=drained)
    ids = set()
    for rows in (moving, gone, handed_over, retired):
        ids |= set(rows.values_list("endpoint_id", flat=True))
    # a distributed endpoint's group is looked at every pass: its Ray nodes' state lives in another app
    groups = Endpoint.objects.filter(pipeline_parallel__gt=1).exclude(status=EndpointStatus.STOPPED)
    ids |= set(groups.exclude(group_failure_code=START_FAILED).values_list("pk", flat=True))
    return sorted(ids)


def endpoint_heal(*, endpoint_id: object) -> list[EndpointReplica]:
    """Replace the endpoint's lost replicas (see the module); returns the replacements started.

    Each goes to a node holding the model where it fits, preferring nodes without a replica of this
    endpoint; where none fits the lost replica stays (and is tried again next pass). Writes an
    `endpoint.replica_replaced` event on the new replica's node saying why.
    """
    with transaction.atomic():
        endpoint = lock_endpoint(endpoint_id)
        if endpoint is None:
            return []
        stopping = endpoint.status in (EndpointStatus.STOPPING, EndpointStatus.STOPPED)
        # a group down by a loss is stopping while a rank's stop waits on its offline node: it may start elsewhere
        if endpoint.distributed and (not stopping or endpoint.group_failure_code in HEALED):
            # its ranks fail and start as one (`group_health`), never replaced one by one
            return group_heal(actor=system_actor(endpoint.cluster.workspace), endpoint=endpoint)
        if stopping:
            return []
        actor = system_actor(endpoint.cluster.workspace)
        _stop_handed_over(endpoint, actor)
        current = list(
            EndpointReplica.objects.select_for_update(of=("self",))
            .select_related("node")
            .filter(endpoint=endpoint, replacements__isnull=True, retired_at__isnull=True)
            .order_by("created_at", "server_id")
        )
        lost = [(replica, why) for replica in current if (why := replica_lost(replica))]
        made = []
        for old, why in lost:
            serving = {r.node_id for r in current if r.status in _LIVE and r not in {o for o, _ in lost}}
            try:
                target = pick_replica_node(endpoint, avoid=serving | {old.node_id})
            except PlacementError as exc:
                log.info("endpoint %s: no node for a replacement of replica %s: %s", endpoint.slug, old.server_id, exc)
                continue
            try:
                with transaction.atomic():  # a savepoint: a replacement the quotas refuse leaves nothing
                    new = EndpointReplica.objects.create(endpoint=endpoint, replacement_of=old, node=target)
                    command = replica_queue_start(actor=actor, endpoint=endpoint, replica=new, node=target)
            except QuotaExceeded as exc:
                log.info("endpoint %s: replica %s not replaced: %s", endpoint.slug, old.server_id, exc)
                continue
            if old.status in _LIVE and old.node is not None and old.node.status != NodeStatus.DRAINING:
                replica_queue_stop(actor=actor, endpoint=endpoint, replica=old)
            current.append(new)
            made.append(new)
            endpoint_event_record(
                endpoint=endpoint,
                node_id=target.pk,
                kind="endpoint.replica_replaced",
                message=f"Endpoint {endpoint.hostname}: replica {old.server_id} replaced by {new.server_id} "
                f"on {target.name} ({why})",
                data={"replaced": old.server_id, "reason": why},
                command=command,
            )
        endpoint_summarise(endpoint)
    return made


def _stop_handed_over(endpoint: Endpoint, actor: AbstractBaseUser) -> None:
    """Stop the replicas still live that left rotation ENDPOINT_DRAIN_S ago or more (the requests they still
    served had that long): those whose replacement has run that long (a draining node's, a rolling
    update's), and those retired that long ago (`replica_retire`)."""
    drained = timezone.now() - timedelta(seconds=settings.ENDPOINT_DRAIN_S)
    taken_over = EndpointReplica.objects.filter(
        replacements__status=EndpointStatus.RUNNING, replacements__updated_at__lte=drained
    )
    for old in (
        EndpointReplica.objects.select_for_update(of=("self",))
        .select_related("node")
        .filter(endpoint=endpoint, status__in=_LIVE)
        .filter(Q(pk__in=taken_over.values("pk")) | Q(retired_at__lte=drained))
    ):
        replica_queue_stop(actor=actor, endpoint=endpoint, replica=old)

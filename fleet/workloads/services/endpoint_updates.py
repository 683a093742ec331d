"""Rolling update of an endpoint to another model revision: new replicas first, the old ones after.

`endpoint_update` starts, for each serving replica, a replacement of the new revision (placed like new
replicas: on nodes holding that revision where it fits) and leaves the old replicas serving. Each old
replica leaves rotation once its replacement runs, and is stopped `ENDPOINT_DRAIN_S` later by the healing
pass (`endpoint_heal`), so requests keep being answered throughout: by the old replicas until the new ones
pass their readiness check (the agent reports `endpoint.start` done only once the server answers), then
by the new ones. A replacement that fails to start leaves its old replica serving.
"""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction

from cleverthis.audit.services import on, operator_action
from cleverthis.tenancy.mixins import require_operator
from cleverthis.tenancy.quotas import locked_quota
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.services.endpoint_events import endpoint_event_record
from fleet.workloads.services.endpoint_replicas import endpoint_summarise, replica_queue_start
from fleet.workloads.services.endpoints import pick_replica_node, validate_revision
from kernel.exceptions import IllegalTransition

_SERVING = (EndpointStatus.PENDING, EndpointStatus.STARTING, EndpointStatus.RUNNING)


@operator_action(
    "endpoint.update",
    target=on("endpoint", "endpoint"),
    detail=lambda kw, _: {"revision": str(kw.get("revision"))[:200]},
)
def endpoint_update(*, actor: AbstractBaseUser, endpoint: Endpoint, revision: str) -> Endpoint:
    """Roll a running endpoint over to `revision` (Owner/Admin only; see the module). 409 when it is not
    running or already serves that revision, or (`PlacementError`, `QuotaExceeded`; nothing written) when
    a new replica fits on no node or the workspace's GPU/VRAM quota cannot hold old and new side by side."""
    require_operator(actor, endpoint.cluster.workspace)
    validate_revision(revision)
    with transaction.atomic():
        locked_quota(endpoint.cluster.workspace_id)  # first: the lock order of admissions (tenancy.quotas)
        endpoint = Endpoint.objects.select_for_update(of=("self",)).select_related("cluster").get(pk=endpoint.pk)
        if endpoint.status != EndpointStatus.RUNNING:
            raise IllegalTransition(f"This endpoint is {endpoint.status}; only a running one can be updated.")
        if revision == endpoint.revision:
            raise IllegalTransition(f"This endpoint serves {endpoint.model_id}@{revision} already.")
        old_revision, endpoint.revision = endpoint.revision, revision
        endpoint.save(update_fields=["revision", "updated_at"])
        serving = list(
            EndpointReplica.objects.select_for_update(of=("self",))
            .filter(endpoint=endpoint, replacements__isnull=True, retired_at__isnull=True, status__in=_SERVING)
            .order_by("created_at", "server_id")
        )
        used: set[object] = set()
        for old in serving:
            target = pick_replica_node(endpoint, avoid=used, revision=revision)
            used.add(target.pk)
            new = EndpointReplica.objects.create(endpoint=endpoint, replacement_of=old, node=target)
            command = replica_queue_start(actor=actor, endpoint=endpoint, replica=new, node=target)
            endpoint_event_record(
                endpoint=endpoint,
                node_id=target.pk,
                kind="endpoint.updating",
                message=f"Endpoint {endpoint.hostname}: replica {new.server_id} of {endpoint.model_id}@{revision} "
                f"replaces {old.server_id} (@{old_revision}) once it answers",
                data={"replaces": old.server_id},
                command=command,
            )
        endpoint_summarise(endpoint)
    endpoint.refresh_from_db()
    return endpoint

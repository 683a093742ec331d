"""The lock order of the endpoint aggregate: the workspace's quota row, then the endpoint's row, then its
replicas' (as admissions lock, `tenancy.quotas`), so passes that may start replicas never deadlock."""

from __future__ import annotations

from collections.abc import Collection

from fleet.models import Node
from fleet.workloads.models import Endpoint, EndpointReplica
from tenancy.quotas import locked_quota


def _workspace_of_endpoint(endpoint_id: object) -> object:
    """The workspace id of an endpoint (None when it is gone): to lock its quota row before the endpoint's."""
    return Endpoint.objects.filter(pk=endpoint_id).values_list("cluster__workspace_id", flat=True).first()


def lock_endpoint(endpoint_id: object) -> Endpoint | None:
    """For a pass that may start replicas (inside its transaction): lock the workspace's quota row, then the
    endpoint's (the lock order of admissions, `tenancy.quotas`); the endpoint with its cluster and workspace,
    or None when it is gone."""
    workspace_id = _workspace_of_endpoint(endpoint_id)
    if workspace_id is None:
        return None
    locked_quota(workspace_id)
    return (
        Endpoint.objects.select_for_update(of=("self",))
        .select_related("cluster__workspace")
        .filter(pk=endpoint_id)
        .first()
    )


def lock_endpoints_on(node: Node, statuses: Collection[str]) -> list[Endpoint]:
    """Lock (in a stable order) the endpoints with a replica on `node` in one of `statuses`."""
    ids = EndpointReplica.objects.filter(node=node, status__in=statuses).values("endpoint_id")
    return list(Endpoint.objects.select_for_update().filter(pk__in=ids).order_by("pk"))

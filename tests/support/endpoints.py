"""Hand-made endpoint rows for tests that need one without an agent starting it."""

from __future__ import annotations

from typing import Any

from fleet.models import ComputeCluster, Node
from fleet.workloads.models import Endpoint, EndpointReplica


def endpoint_row(*, cluster: ComputeCluster, node: Node | None, **fields: Any) -> Endpoint:
    """An endpoint of one replica on `node` in the given state (as the services leave it once the agent
    answered): the replica has the endpoint's status, port and failure, and the slug as its server id."""
    endpoint = Endpoint.objects.create(cluster=cluster, node=node, **fields)
    EndpointReplica.objects.create(
        endpoint=endpoint,
        server_id=endpoint.slug,
        node=node,
        status=endpoint.status,
        port=endpoint.port,
        failure_code=endpoint.failure_code,
        failure_message=endpoint.failure_message,
    )
    return endpoint

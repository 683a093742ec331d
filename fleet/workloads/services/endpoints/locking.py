"""The lock order of the endpoint aggregate: the workspace's quota row, then the endpoint's row, then its
replicas' (as admissions lock, `tenancy.quotas`), so passes that may start replicas never deadlock.

The fleet locks rows in one order on every path (docs/architecture.md, "Lock order"): a workspace's
quota row, endpoints (by primary key), their replicas, nodes (by primary key), commands (by primary key),
then whatever is inserted. Recording an agent's ack or outcome of an endpoint.start / endpoint.stop
follows it up on the endpoint (`endpoint_record_acked`, `endpoint_record_command_outcome`); the batch
that records it locks those endpoints first (`endpoints_lock_for_commands`), before its nodes and commands."""

from __future__ import annotations

from collections.abc import Collection

from django.db.models import Q
from django.db.models.fields.json import KT

from fleet.models import Command, CommandType, Node
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


_ENDPOINT_COMMANDS = (CommandType.ENDPOINT_START, CommandType.ENDPOINT_STOP)


def endpoints_lock_for_commands(*, command_ids: list[object]) -> list[Endpoint]:
    """Lock (inside the caller's transaction, in primary-key order) the endpoints whose replicas the
    endpoint.start / endpoint.stop among `command_ids` concern; returns them. One query."""
    # A replica names its command; one sent from the Commands tab may name only the replica's server id.
    named = (
        Command.objects.filter(pk__in=command_ids, command_type__in=_ENDPOINT_COMMANDS)
        .annotate(server_id=KT("payload__endpoint_id"))
        .values("server_id")
    )
    concerned = (
        Q(replicas__start_command_id__in=command_ids)
        | Q(replicas__stop_command_id__in=command_ids)
        | Q(replicas__server_id__in=named)
    )
    ids = Endpoint.objects.filter(concerned).values("pk")
    return list(Endpoint.objects.select_for_update(of=("self",)).filter(pk__in=ids).order_by("pk"))

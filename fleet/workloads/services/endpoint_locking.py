"""The endpoints a batch of command reports will touch, locked first (the fleet's lock order).

The fleet locks rows in one order on every path (docs/architecture.md, "Lock order"): a workspace's
quota row, endpoints (by primary key), their replicas, nodes (by primary key), commands (by primary key),
then whatever is inserted. Recording an agent's ack or outcome of an endpoint.start / endpoint.stop
follows it up on the endpoint (`endpoint_record_acked`, `endpoint_record_command_outcome`); the batch
that records it locks those endpoints here, before its nodes and commands.
"""

from __future__ import annotations

from django.db.models import Q
from django.db.models.fields.json import KT

from fleet.models import Command, CommandType
from fleet.workloads.models import Endpoint

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

"""Rolling update of an endpoint to another model revision and/or other server arguments: new replicas
first, the old ones after.

`endpoint_update` starts, for each serving replica, a replacement with the new revision and arguments (placed
like new replicas: on nodes holding that revision where it fits) and leaves the old replicas serving. Each old
replica leaves rotation once its replacement runs, and is stopped `ENDPOINT_DRAIN_S` later by the healing
pass (`endpoint_heal`), so requests keep being answered throughout: by the old replicas until the new ones
pass their readiness check (the agent reports `endpoint.start` done only once the server answers), then
by the new ones. A replacement that fails to start leaves its old replica serving (`endpoint_update_failed`):
the update is called off (the other replacements still starting are stopped), the endpoint's revision and
server arguments go back to what its replicas serve, and its page says why and what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone

from audit.services import on, operator_action
from fleet.models import Command
from fleet.workloads.errors import error_help, error_sentence
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.services.common import system_actor
from fleet.workloads.services.endpoints.events import endpoint_event_record
from fleet.workloads.services.endpoints.placement import pick_replica_node
from fleet.workloads.services.endpoints.replicas import endpoint_summarise, replica_queue_start, replica_retire
from fleet.workloads.services.endpoints.validation import (
    validate_revision,
    validate_routing_policy,
    validate_server_args,
)
from kernel.exceptions import IllegalTransition
from tenancy.mixins import require_editor
from tenancy.quotas import locked_quota

_SERVING = (EndpointStatus.PENDING, EndpointStatus.STARTING, EndpointStatus.RUNNING)


def _asked(value: Any) -> Any:
    """An asked value as the audit trail keeps it (bounded; a malformed one as its repr)."""
    if isinstance(value, str):
        return value[:200]
    if isinstance(value, list) and all(isinstance(a, str) for a in value):
        return [a[:200] for a in value[:64]]
    return repr(value)[:200]


def _update_detail(kw: Mapping[str, Any], value: Endpoint | None) -> dict[str, Any]:
    """The audit detail: `{"revision": {"old", "new"}, "server_args": {"old", "new"}}` once done; what was
    asked when refused."""
    if value is not None:
        old_revision, old_args = value.rolled_from
        return {
            "revision": {"old": old_revision, "new": value.revision},
            "server_args": {"old": old_args, "new": value.server_args},
        }
    return {name: _asked(kw[name]) for name in ("revision", "server_args") if kw.get(name) is not None}


def _args_text(args: list[str]) -> str:
    return " ".join(args) if args else "no extra server arguments"


@operator_action("endpoint.update", target=on("endpoint", "endpoint"), detail=_update_detail)
def endpoint_update(
    *,
    actor: AbstractBaseUser,
    endpoint: Endpoint,
    revision: str | None = None,
    server_args: list[str] | None = None,
) -> Endpoint:
    """Roll a running endpoint over to `revision` and/or `server_args` (None: keep the current one; Owner, Admin,
    Member; see the module). 400 (ValidationError) for a malformed value or neither given; 409 when it is not
    running or already serves that revision with those arguments, or (`PlacementError`, `QuotaExceeded`;
    nothing written) when a new replica fits on no node or the workspace's GPU/VRAM quota cannot hold old
    and new side by side. The returned endpoint's `rolled_from` is its (revision, server_args) before."""
    require_editor(actor, endpoint.cluster.workspace, what="update endpoints")
    if revision is None and server_args is None:
        raise ValidationError({"revision": "Give a revision and/or server_args to update the endpoint to."})
    if revision is not None:
        validate_revision(revision)
    if server_args is not None:
        server_args = validate_server_args(server_args)
    with transaction.atomic():
        locked_quota(endpoint.cluster.workspace_id)  # first: the lock order of admissions (tenancy.quotas)
        endpoint = Endpoint.objects.select_for_update(of=("self",)).select_related("cluster").get(pk=endpoint.pk)
        if endpoint.status != EndpointStatus.RUNNING:
            raise IllegalTransition(f"This endpoint is {endpoint.status}; only a running one can be updated.")
        if endpoint.distributed:  # its ranks form one vLLM: no rank can be replaced alongside the others
            raise IllegalTransition("A distributed endpoint is not rolled over: stop it, then start it again.")
        old_revision, old_args = endpoint.revision, list(endpoint.server_args)
        new_revision = old_revision if revision is None else revision
        new_args = old_args if server_args is None else server_args
        if (new_revision, new_args) == (old_revision, old_args):
            raise IllegalTransition(
                f"This endpoint serves {endpoint.model_id}@{new_revision} with {_args_text(new_args)} already."
            )
        endpoint.revision, endpoint.server_args = new_revision, new_args
        endpoint.save(update_fields=["revision", "server_args", "updated_at"])
        serving = list(
            EndpointReplica.objects.select_for_update(of=("self",))
            .filter(endpoint=endpoint, replacements__isnull=True, retired_at__isnull=True, status__in=_SERVING)
            .order_by("created_at", "server_id")
        )
        changes = []
        if new_revision != old_revision:
            changes.append(f"@{old_revision} → @{new_revision}")
        if new_args != old_args:
            changes.append(f"server arguments {_args_text(old_args)} → {_args_text(new_args)}")
        used: set[object] = set()
        for old in serving:
            target = pick_replica_node(endpoint, avoid=used, revision=new_revision)
            used.add(target.pk)
            new = EndpointReplica.objects.create(endpoint=endpoint, replacement_of=old, node=target)
            command = replica_queue_start(actor=actor, endpoint=endpoint, replica=new, node=target)
            endpoint_event_record(
                endpoint=endpoint,
                node_id=target.pk,
                kind="endpoint.updating",
                message=f"Endpoint {endpoint.hostname}: replica {new.server_id} of {endpoint.model_id} replaces "
                f"{old.server_id} once it answers ({'; '.join(changes)})",
                data={
                    "replaces": old.server_id,
                    "revision": {"old": old_revision, "new": new_revision},
                    "server_args": {"old": old_args, "new": new_args},
                },
                command=command,
            )
        endpoint_summarise(endpoint)
    endpoint.refresh_from_db()
    endpoint.rolled_from = (old_revision, old_args)
    return endpoint


@operator_action(
    "endpoint.routing",
    target=on("endpoint", "endpoint"),
    detail=lambda kw, value: {"routing_policy": _asked(kw.get("routing_policy"))},
)
def endpoint_set_routing(*, actor: AbstractBaseUser, endpoint: Endpoint, routing_policy: str) -> Endpoint:
    """Set how the proxy spreads the endpoint's requests over its replicas (Owner, Admin, Member; any state, no
    replica restarts: every web process routes by it within PROXY_ROUTE_CACHE_S). 400 for an unknown policy."""
    require_editor(actor, endpoint.cluster.workspace, what="change how endpoints route")
    validate_routing_policy(routing_policy)
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update(of=("self",)).select_related("cluster").get(pk=endpoint.pk)
        if endpoint.routing_policy == routing_policy:
            return endpoint
        old, endpoint.routing_policy = endpoint.routing_policy, routing_policy
        endpoint.save(update_fields=["routing_policy", "updated_at"])
        endpoint_event_record(
            endpoint=endpoint,
            kind="endpoint.routing",
            message=f"Endpoint {endpoint.hostname}: routing policy {old} → {routing_policy} by {actor.get_username()}",
            data={"routing_policy": {"old": old, "new": routing_policy}},
        )
    return endpoint


UPDATE_FAILED_FIX = (
    "Read why the replacement failed (its server's log tail is in the event before this one, and on the "
    "Commands tab), correct the server arguments or revision, then update again. An endpoint on a node without "
    "GPUs needs a free core and memory for the replacement beside its old replica while it loads."
)


def endpoint_update_failed(*, endpoint: Endpoint, replica: EndpointReplica, command: Command) -> None:
    """A rolling update's replacement `replica` failed to start (the caller holds the endpoint's lock and has
    marked it failed). While its old replica still serves, the update is called off: the other replacements
    still starting are stopped, the endpoint's revision and server arguments go back to what the old replicas
    run (unless a replacement already took over), and an `endpoint.update_failed` event says why and what to
    do (the endpoint's page shows it until the next update)."""
    old = replica.replacement_of
    if old is None or old.status not in _SERVING or old.retired_at is not None:
        return
    started = old.start_command.parsed_payload if old.start_command is not None else None
    old_revision = started.revision if started is not None else endpoint.revision
    old_args = list(started.extra_args) if started is not None else list(endpoint.server_args)
    new_revision, new_args = endpoint.revision, list(endpoint.server_args)
    siblings = EndpointReplica.objects.filter(endpoint=endpoint, replacement_of__isnull=False).exclude(pk=replica.pk)
    took_over = siblings.filter(status=EndpointStatus.RUNNING, replacement_of__retired_at__isnull=False).exists()
    in_flight = list(siblings.filter(status__in=_SERVING, replacement_of__retired_at__isnull=True))
    if in_flight:
        try:
            actor = system_actor(endpoint.cluster.workspace)
        except PermissionDenied:  # no Owner/Admin to stop them as: they stay until someone stops them
            in_flight = []
        for sibling in in_flight:
            replica_retire(actor=actor, endpoint=endpoint, replica=sibling)
    # the old replicas are the current ones again (healed, updated by the next update): the called-off
    # replacements leave rotation and replace nothing
    now = timezone.now()
    EndpointReplica.objects.filter(pk__in=[r.pk for r in in_flight]).update(replacement_of=None, retired_at=now)
    replica.replacement_of, replica.retired_at = None, now
    replica.save(update_fields=["replacement_of", "retired_at", "updated_at"])
    if not took_over and (old_revision, old_args) != (new_revision, new_args):
        endpoint.revision, endpoint.server_args = old_revision, old_args
        endpoint.save(update_fields=["revision", "server_args", "updated_at"])
    serving_now = f"{endpoint.model_id}@{old_revision} with {_args_text(old_args)}"
    settings_note = (
        "some replicas already run the new settings, which the endpoint keeps"
        if took_over
        else "the endpoint's settings are back to those"
    )
    endpoint_event_record(
        endpoint=endpoint,
        node_id=command.node_id,
        kind="endpoint.update_failed",
        message=f"Endpoint {endpoint.hostname}: the update to {endpoint.model_id}@{new_revision} with "
        f"{_args_text(new_args)} failed: replacement {replica.server_id} could not start "
        f"({error_sentence(command.error_code or replica.failure_code, replica.failure_message)}). Replica "
        f"{old.server_id} keeps serving {serving_now}; {settings_note}.",
        data={
            "replica": replica.server_id,
            "replaces": old.server_id,
            "revision": {"old": old_revision, "new": new_revision},
            "server_args": {"old": old_args, "new": new_args},
            "error_help": error_help(replica.failure_code),
            "fix": UPDATE_FAILED_FIX,
        },
        command=command,
    )

"""Helpers the workload services share: limits of model ids, failure events, the automatic actor."""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import PermissionDenied

from agent import protocol
from agent.protocol.rules import field_rules
from fleet.models import Command, NodeEvent
from fleet.services import node_event_record
from fleet.workloads.errors import error_help, error_sentence
from tenancy.models import Membership, Role, Workspace

# As long as endpoint.start and model.download take them (`agent.protocol` rules).
MAX_MODEL_ID = int(field_rules(protocol.ModelDownloadPayload)["model_id"].max_length or 0)
MAX_REVISION = int(field_rules(protocol.ModelDownloadPayload)["revision"].max_length or 0)


def node_event_record_failure(*, command: Command, kind: str, what: str) -> NodeEvent:
    """`<what>: <why>. Fix: <fix>` in the node's event log, with the error's explanation as data."""
    return node_event_record(
        node_id=command.node_id,
        kind=kind,
        message=f"{what}: {error_sentence(command.error_code, command.error_message)}",
        data={"error_help": error_help(command.error_code)},
        command=command,
    )


def system_actor(workspace: Workspace) -> AbstractBaseUser:
    """The user the control plane acts as for automatic commands (drain): the first Owner, else Admin."""
    membership = (
        Membership.objects.filter(workspace=workspace, role__in=[Role.OWNER, Role.ADMIN])
        .select_related("user")
        .order_by("-role", "created_at", "pk")  # "owner" sorts after "admin": descending puts owners first
        .first()
    )
    if membership is None:
        raise PermissionDenied("The workspace has no Owner or Admin to run automatic commands as.")
    return membership.user

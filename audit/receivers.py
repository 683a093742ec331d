"""Entries for what tenancy announces by signal rather than through an operator service (tenancy cannot
import the audit app; connected by `AuditConfig.ready`)."""

from __future__ import annotations

from typing import Any

from audit.services import Target, entry_record, register_action
from tenancy.models import Workspace
from tenancy.signals import quota_changed, sso_memberships_changed

SSO_MEMBERSHIP = register_action("membership.sso_sync", "membership")
QUOTA_ACTION = register_action("workspace.set_quotas", "workspace")


def record_sso_membership_changes(*, user: Any, changes: list[Any], claim_values: list[str], **_: Any) -> None:
    """One entry per membership the single sign-on claim mapping created, changed or removed, in the
    sign-in's transaction; the actor is the user signing in."""
    for change in changes:
        entry_record(
            name=SSO_MEMBERSHIP,
            actor=user,
            target=Target("membership", str(change.membership_id or ""), user.get_username(), change.workspace.pk),
            detail={"role": change.after, "previous_role": change.before, "claim_values": claim_values[:50]},
        )


def record_quota_change(*, workspace: Workspace, actor: Any, changes: dict[str, list[Any]], **_: Any) -> None:
    """One `ok` entry per quota change, in the change's own transaction: which limits, from what to what."""
    entry_record(
        name=QUOTA_ACTION,
        actor=actor,
        target=Target("workspace", str(workspace.pk), workspace.name[:255], workspace.pk),
        detail={"changes": {name: {"from": old, "to": new} for name, (old, new) in changes.items()}},
    )


def connect() -> None:
    """Connect the receivers (idempotent: dispatch_uid)."""
    sso_memberships_changed.connect(record_sso_membership_changes, dispatch_uid="audit.sso_memberships")
    quota_changed.connect(record_quota_change, dispatch_uid="audit.quota_changed")

"""Audit entries for changes tenancy announces by signal (tenancy cannot import the audit app)."""

from __future__ import annotations

import uuid
from typing import Any

from django.utils import timezone

from cleverthis.audit.models import AuditEntry, Outcome
from cleverthis.audit.services import ACTIONS, TARGET_TYPES
from cleverthis.tenancy.models import Workspace
from cleverthis.tenancy.signals import quota_changed

QUOTA_ACTION = "workspace.set_quotas"


def connect() -> None:
    """Connect the receivers (called from `AuditConfig.ready()`; idempotent)."""
    ACTIONS.add(QUOTA_ACTION)
    TARGET_TYPES.add("workspace")
    quota_changed.connect(record_quota_change, dispatch_uid="audit.quota_changed")


def record_quota_change(
    sender: object, workspace: Workspace, actor: Any, changes: dict[str, list[Any]], **_: Any
) -> None:
    """One `ok` entry per quota change, in the change's own transaction: which limits, from what to what."""
    now = timezone.now()
    AuditEntry.objects.create(
        id=uuid.uuid4(),
        workspace=workspace,
        actor_id=getattr(actor, "pk", None),
        actor_name=actor.get_username() if getattr(actor, "is_authenticated", False) else "",
        action=QUOTA_ACTION,
        target_type="workspace",
        target_id=str(workspace.pk),
        target_name=workspace.name[:255],
        outcome=Outcome.OK,
        detail={"changes": {name: {"from": old, "to": new} for name, (old, new) in changes.items()}},
        created_at=now,
        finished_at=now,
    )

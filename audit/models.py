"""AuditEntry: one operator action on one target, with its outcome."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from tenancy.models import Workspace


class Outcome(models.TextChoices):
    """How an operator action ended.

    `pending`: accepted, and the commands it sent to nodes have not all finished yet; it becomes `ok`
    when they all succeeded, or `failed` (with the first error) when one failed.
    """

    OK = "ok", "OK"
    PENDING = "pending", "Pending"
    FAILED = "failed", "Failed"
    REFUSED = "refused", "Refused"


class AuditEntry(models.Model):
    """Who did what to which target, when, and how it ended; scoped to the target's workspace.

    Written by `audit.services.operator_action` in the action's own transaction (refusals
    after its rollback). `git_commit` is the commit an argocd-mode agent reported for a deploy the
    action sent. Names are copied in (`actor_name`, `target_name`) so the entry outlives its rows.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="audit_entries")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=150, blank=True, default="")
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=32)
    target_id = models.CharField(max_length=64, blank=True, default="")
    target_name = models.CharField(max_length=255, blank=True, default="")
    outcome = models.CharField(max_length=16, choices=Outcome.choices, default=Outcome.OK)
    reason = models.TextField(blank=True, default="")
    detail = models.JSONField(default=dict, blank=True)
    git_commit = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [
            models.Index(fields=["workspace", "-created_at"], name="audit_workspace_created"),
            models.Index(fields=["action", "-created_at"], name="audit_action_created"),
            models.Index(fields=["actor_name", "-created_at"], name="audit_actor_created"),
            models.Index(fields=["target_type", "target_id"], name="audit_target"),
        ]

    def __str__(self) -> str:
        target = self.target_name or self.target_id
        return f"{self.actor_name or '—'} {self.action} {self.target_type} {target} ({self.outcome})"

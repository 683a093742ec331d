"""Workspace, Membership, Role, and the single sign-on identity of a user."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


class Role(models.TextChoices):
    """A member's role in a workspace, from most to least powerful."""

    OWNER = "owner", "Owner"
    ADMIN = "admin", "Admin"
    MEMBER = "member", "Member"
    VIEWER = "viewer", "Viewer"

    @classmethod
    def operators(cls) -> frozenset[str]:
        """Roles allowed to change infrastructure and send commands to nodes."""
        return frozenset({cls.OWNER, cls.ADMIN})

    @classmethod
    def editors(cls) -> frozenset[str]:
        """Roles allowed to create workloads (jobs, deployments) but not touch nodes."""
        return frozenset({cls.OWNER, cls.ADMIN, cls.MEMBER})


class Workspace(models.Model):
    """A tenant: every fleet and Ray object belongs to exactly one workspace."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        permissions = [
            ("operate_workspace", "Can operate nodes and send commands in the workspace"),
            ("edit_workspace", "Can create workloads in the workspace"),
        ]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    """A user's role in one workspace; the source of truth for the guardian object permissions."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    # Granted by the single sign-on claim mapping (OIDC_WORKSPACE_MAP): the mapping changes and removes
    # only such memberships; one set by hand (an invitation, the admin) is never touched by it.
    granted_by_sso = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "workspace"], name="membership_unique_user_workspace")]
        ordering = ["workspace__name", "user__username"]

    def __str__(self) -> str:
        return f"{self.user} in {self.workspace} as {self.get_role_display()}"


class SsoIdentity(models.Model):
    """The OpenID Connect account (issuer + subject) a user signs in with; users are matched by it, never
    by e-mail, so a provider account can never take over a local one."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sso_identity")
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    # the values of the mapped claim (OIDC_GROUPS_CLAIM) at the last sign-in, shown when none maps
    claim_values = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_sign_in_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["issuer", "subject"], name="sso_identity_unique_subject")]
        verbose_name = "single sign-on identity"

    def __str__(self) -> str:
        return f"{self.user} as {self.subject} at {self.issuer}"

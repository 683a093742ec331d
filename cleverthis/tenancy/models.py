"""Workspace, Membership and Role."""

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
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "workspace"], name="membership_unique_user_workspace")]
        ordering = ["workspace__name", "user__username"]

    def __str__(self) -> str:
        return f"{self.user} in {self.workspace} as {self.get_role_display()}"


class WorkspaceQuota(models.Model):
    """A workspace's quotas: one row per workspace, each limit empty (None) when unlimited.

    Set by the workspace's Owner (page, API) or by staff in the admin through
    `cleverthis.tenancy.quotas.workspace_quota_set`; checked by `quotas.admit`, which locks this row
    so that admissions of one workspace take turns. Resources are what containers, endpoints and Ray
    nodes request, not what they use.
    """

    workspace = models.OneToOneField(Workspace, primary_key=True, on_delete=models.CASCADE, related_name="quota")
    gpus = models.PositiveIntegerField(null=True, blank=True, help_text="GPUs; empty: unlimited.")
    vram_gib = models.FloatField(null=True, blank=True, help_text="GPU memory in GiB; empty: unlimited.")
    cpu_cores = models.FloatField(null=True, blank=True, help_text="CPU cores; empty: unlimited.")
    memory_gib = models.FloatField(null=True, blank=True, help_text="Memory in GiB; empty: unlimited.")
    containers = models.PositiveIntegerField(null=True, blank=True, help_text="Containers; empty: unlimited.")
    endpoints = models.PositiveIntegerField(null=True, blank=True, help_text="Endpoints; empty: unlimited.")
    ray_clusters = models.PositiveIntegerField(null=True, blank=True, help_text="Ray clusters; empty: unlimited.")
    ray_workers = models.PositiveIntegerField(null=True, blank=True, help_text="Ray workers; empty: unlimited.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "workspace quota"

    def __str__(self) -> str:
        return f"Quotas of {self.workspace_id}"

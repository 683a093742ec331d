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


class ApiKeyScope(models.TextChoices):
    """What an API key may be used for; its owner's current role still bounds each."""

    READ = "read", "Read the API"
    OPERATE = "operate", "Change things (as the owner's role allows)"
    INVOKE = "invoke", "Invoke endpoints"


class ApiKey(models.Model):
    """A member's key for the API and endpoint origins, bound to one workspace; only its hash is kept.

    The secret is shown once at creation (`ctk_<prefix>_<secret>`); `prefix` is its public part, shown in
    lists. Rights are the key's scopes intersected with the owner's current role in `workspace`.
    """

    id = models.BigAutoField(primary_key=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    # limits on endpoint invocation through this key (None: only the endpoint's own defaults apply)
    requests_per_min = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_min = models.PositiveIntegerField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    last_used_ip = models.GenericIPAddressField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["user", "workspace"], name="apikey_user_workspace")]

    def __str__(self) -> str:
        return f"API key {self.name} (ctk_{self.prefix}…)"

    @property
    def display(self) -> str:
        """The public part of the key, as lists show it."""
        return f"ctk_{self.prefix}_…"


class WorkspaceQuota(models.Model):
    """A workspace's quotas: one row per workspace, each limit empty (None) when unlimited.

    Set by the workspace's Owner (page, API) or by staff in the admin through
    `tenancy.quotas.workspace_quota_set`; checked by `quotas.admit`, which locks this row
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

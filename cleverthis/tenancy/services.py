"""Writes for workspaces, memberships and quotas; memberships keep guardian permissions in step with the role."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils.text import slugify
from guardian.shortcuts import assign_perm, remove_perm

from cleverthis.tenancy.models import Membership, Role, Workspace, WorkspaceQuota
from cleverthis.tenancy.permissions import EDIT_PERM, OPERATE_PERM, VIEW_PERM, is_owner
from cleverthis.tenancy.quotas import BY_NAME, locked_quota
from cleverthis.tenancy.signals import quota_changed

MAX_LIMIT = 1_000_000


def _sync_permissions(membership: Membership) -> None:
    """Grant exactly the guardian permissions that `membership.role` implies, and revoke the rest."""
    user, workspace, role = membership.user, membership.workspace, membership.role
    wanted = {
        VIEW_PERM: True,
        EDIT_PERM: role in Role.editors(),
        OPERATE_PERM: role in Role.operators(),
    }
    for perm, granted in wanted.items():
        (assign_perm if granted else remove_perm)(perm, user, workspace)


@transaction.atomic
def workspace_create(*, name: str, owner: AbstractBaseUser, slug: str | None = None) -> Workspace:
    """Create a workspace with `owner` as its Owner."""
    workspace = Workspace.objects.create(name=name, slug=slug or slugify(name))
    WorkspaceQuota.objects.create(workspace=workspace)  # every limit empty: unlimited
    membership_set(workspace=workspace, user=owner, role=Role.OWNER)
    return workspace


@transaction.atomic
def membership_set(*, workspace: Workspace, user: AbstractBaseUser, role: Role | str) -> Membership:
    """Add `user` to `workspace` with `role`, or change their role if already a member."""
    membership, _ = Membership.objects.update_or_create(user=user, workspace=workspace, defaults={"role": Role(role)})
    _sync_permissions(membership)
    return membership


@transaction.atomic
def membership_remove(*, workspace: Workspace, user: AbstractBaseUser) -> None:
    """Remove `user` from `workspace` and revoke every workspace permission they held."""
    Membership.objects.filter(user=user, workspace=workspace).delete()
    for perm in (VIEW_PERM, EDIT_PERM, OPERATE_PERM):
        remove_perm(perm, user, workspace)


def _clean_limit(name: str, value: Any) -> float | None:
    """A limit as stored: None (unlimited), a whole number for counts, a number for cores and GiB."""
    if value is None or value == "":
        return None
    quota = BY_NAME[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError({name: "A number, or empty for unlimited."})
    if quota.whole and not float(value).is_integer():
        raise ValidationError({name: "A whole number, or empty for unlimited."})
    if not 0 <= value <= MAX_LIMIT:
        raise ValidationError({name: f"From 0 to {MAX_LIMIT}, or empty for unlimited."})
    return int(value) if quota.whole else float(value)


@transaction.atomic
def workspace_quota_set(
    *, actor: AbstractBaseUser, workspace: Workspace, limits: Mapping[str, Any], staff: bool = False
) -> WorkspaceQuota:
    """Set some of the workspace's quota limits (name → number, None for unlimited); the others stay.

    Only the workspace's Owner may, or staff through the admin (`staff=True`); 403 otherwise, 400 with
    field messages for an unknown quota or a bad number. A limit below what is in use refuses new work
    and stops nothing. Every change is sent as `quota_changed` (the audit trail records it).
    """
    if not (staff or is_owner(actor, workspace)):
        raise PermissionDenied("Only the workspace's Owner can change its quotas.")
    unknown = sorted(set(limits) - set(BY_NAME))
    if unknown:
        raise ValidationError({name: "No such quota." for name in unknown})
    clean = {name: _clean_limit(name, value) for name, value in limits.items()}
    row = locked_quota(workspace.pk)  # in turn with admissions: the new limit applies to the next one
    changes = {name: [getattr(row, name), value] for name, value in clean.items() if getattr(row, name) != value}
    for name, (_, value) in changes.items():
        setattr(row, name, value)
    if changes:
        row.save(update_fields=[*changes, "updated_at"])
        quota_changed.send(sender=WorkspaceQuota, workspace=workspace, actor=actor, changes=changes)
    return row

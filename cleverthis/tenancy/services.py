"""Writes for workspaces and memberships; each keeps guardian permissions in step with the role."""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.utils.text import slugify
from guardian.shortcuts import assign_perm, remove_perm

from cleverthis.tenancy.models import Membership, Role, Workspace
from cleverthis.tenancy.permissions import EDIT_PERM, OPERATE_PERM, VIEW_PERM


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

"""Role checks, answered by django-guardian object permissions on the workspace."""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser

from cleverthis.tenancy.models import Membership, Role, Workspace

VIEW_PERM = "tenancy.view_workspace"
EDIT_PERM = "tenancy.edit_workspace"
OPERATE_PERM = "tenancy.operate_workspace"


def can_view(user: AbstractBaseUser | AnonymousUser, workspace: Workspace) -> bool:
    """True if `user` is any kind of member of `workspace`."""
    return bool(user.is_authenticated and user.has_perm(VIEW_PERM, workspace))


def can_edit(user: AbstractBaseUser | AnonymousUser, workspace: Workspace) -> bool:
    """True if `user` may create workloads in `workspace` (Owner, Admin, Member)."""
    return bool(user.is_authenticated and user.has_perm(EDIT_PERM, workspace))


def can_operate(user: AbstractBaseUser | AnonymousUser, workspace: Workspace) -> bool:
    """True if `user` may manage nodes and send commands in `workspace` (Owner, Admin)."""
    return bool(user.is_authenticated and user.has_perm(OPERATE_PERM, workspace))


def is_owner(user: AbstractBaseUser | AnonymousUser, workspace: Workspace) -> bool:
    """True if `user` is the workspace's Owner (quotas are theirs to set)."""
    return bool(
        user.is_authenticated
        and Membership.objects.filter(user_id=user.pk, workspace=workspace, role=Role.OWNER).exists()
    )

"""Role checks, answered by django-guardian object permissions on the workspace.

A request authenticated by an API key (`user.api_key_grant`, set by `tenancy.authentication`) gets no
more than the key allows: its own workspace only, editing and operating with the operate scope, and never
beyond the owner's role, which is checked as for a session. Viewing needs any scope of an unexpired key of
that workspace: which requests a key may make at all (API reads need read or operate; endpoint origins
need invoke) is decided where it authenticates (`tenancy.authentication`, `fleet.proxy`).
"""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser

from tenancy.models import ApiKeyScope, Membership, Role, Workspace

VIEW_PERM = "tenancy.view_workspace"
EDIT_PERM = "tenancy.edit_workspace"
OPERATE_PERM = "tenancy.operate_workspace"


def _key_allows(user: AbstractBaseUser | AnonymousUser, workspace: Workspace, scope: str | None) -> bool:
    """True unless the user acts through an API key that does not reach `workspace` (with `scope`, if named)."""
    grant = getattr(user, "api_key_grant", None)
    if grant is None:
        return True
    if grant.workspace_id != workspace.pk:
        return False
    return any(grant.allows(s) for s in grant.scopes) if scope is None else grant.allows(scope)


def can_view(user: AbstractBaseUser | AnonymousUser, workspace: Workspace) -> bool:
    """True if `user` is any kind of member of `workspace`."""
    return bool(user.is_authenticated and _key_allows(user, workspace, None) and user.has_perm(VIEW_PERM, workspace))


def can_edit(user: AbstractBaseUser | AnonymousUser, workspace: Workspace) -> bool:
    """True if `user` may create workloads in `workspace` (Owner, Admin, Member)."""
    return bool(
        user.is_authenticated
        and _key_allows(user, workspace, ApiKeyScope.OPERATE)
        and user.has_perm(EDIT_PERM, workspace)
    )


def can_operate(user: AbstractBaseUser | AnonymousUser, workspace: Workspace) -> bool:
    """True if `user` may manage nodes and send commands in `workspace` (Owner, Admin)."""
    return bool(
        user.is_authenticated
        and _key_allows(user, workspace, ApiKeyScope.OPERATE)
        and user.has_perm(OPERATE_PERM, workspace)
    )


def is_owner(user: AbstractBaseUser | AnonymousUser, workspace: Workspace) -> bool:
    """True if `user` is the workspace's Owner (quotas are theirs to set); through an API key, one that may
    operate."""
    return bool(
        user.is_authenticated
        and _key_allows(user, workspace, ApiKeyScope.OPERATE)
        and Membership.objects.filter(user_id=user.pk, workspace=workspace, role=Role.OWNER).exists()
    )

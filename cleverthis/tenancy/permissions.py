"""Role checks, answered by django-guardian object permissions on the workspace.

A request authenticated by an API key (`user.api_key_grant`, set by `tenancy.authentication`) gets no
more than the key allows: its own workspace only, viewing with the read (or operate) scope, editing and
operating with the operate scope, and never beyond the owner's role, which is checked as for a session.
"""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser

from cleverthis.tenancy.models import ApiKeyScope, Workspace

VIEW_PERM = "tenancy.view_workspace"
EDIT_PERM = "tenancy.edit_workspace"
OPERATE_PERM = "tenancy.operate_workspace"


def _key_allows(user: AbstractBaseUser | AnonymousUser, workspace: Workspace, scope: str) -> bool:
    """True unless the user acts through an API key that does not reach `workspace` with `scope`."""
    grant = getattr(user, "api_key_grant", None)
    return grant is None or (grant.workspace_id == workspace.pk and grant.allows(scope))


def can_view(user: AbstractBaseUser | AnonymousUser, workspace: Workspace) -> bool:
    """True if `user` is any kind of member of `workspace`."""
    return bool(
        user.is_authenticated and _key_allows(user, workspace, ApiKeyScope.READ) and user.has_perm(VIEW_PERM, workspace)
    )


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

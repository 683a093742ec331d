"""Reads scoped to the requesting user's workspaces."""

from __future__ import annotations

from typing import TypeVar

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db.models import Model, QuerySet

from tenancy.models import Membership, Workspace

AnyUser = AbstractBaseUser | AnonymousUser
M = TypeVar("M", bound=Model)


def workspace_list(*, user: AnyUser) -> QuerySet[Workspace]:
    """Workspaces `user` is a member of."""
    if not user.is_authenticated:
        return Workspace.objects.none()
    workspaces = Workspace.objects.filter(memberships__user=user)
    grant = getattr(user, "api_key_grant", None)  # an API key reaches its own workspace only
    if grant is not None:
        workspaces = workspaces.filter(pk=grant.workspace_id)
    return workspaces.distinct()


def workspace_ids(*, user: AnyUser, roles: frozenset[str] | None = None) -> QuerySet:
    """IDs of the workspaces `user` belongs to, optionally only those where they hold one of `roles`."""
    if not user.is_authenticated:
        return Membership.objects.none().values("workspace_id")
    memberships = Membership.objects.filter(user=user)
    grant = getattr(user, "api_key_grant", None)  # an API key reaches its own workspace only
    if grant is not None:
        memberships = memberships.filter(workspace_id=grant.workspace_id)
    if roles is not None:
        memberships = memberships.filter(role__in=roles)
    return memberships.values("workspace_id")


def scope_to_user(queryset: QuerySet[M], *, user: AnyUser, workspace_field: str = "workspace") -> QuerySet[M]:
    """Restrict `queryset` to rows whose `workspace_field` is one of `user`'s workspaces."""
    return queryset.filter(**{f"{workspace_field}__in": workspace_ids(user=user)})

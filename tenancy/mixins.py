"""The one place where API querysets are scoped to the requesting user's workspaces."""

from __future__ import annotations

from typing import Any, ClassVar

from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from rest_framework.exceptions import NotFound
from rest_framework.request import Request

from tenancy.models import Workspace
from tenancy.permissions import can_edit, can_operate
from tenancy.selectors import scope_to_user, workspace_list


class WorkspaceScopedMixin:
    """Scope every queryset of a view to the user's workspaces; rows of other workspaces are 404.

    Subclasses provide `get_base_queryset()` (or `queryset`) and `workspace_field`, never
    `get_queryset()`: overriding it is refused at class creation so the scoping cannot be bypassed.
    """

    workspace_field: ClassVar[str] = "workspace"
    request: Request

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "get_queryset" in cls.__dict__:
            raise TypeError(
                f"{cls.__name__} overrides get_queryset(); override get_base_queryset() instead so "
                "workspace scoping stays in force"
            )

    def get_base_queryset(self) -> QuerySet:
        """The unscoped queryset; subclasses may add select_related/annotations here."""
        return self.queryset.all()  # type: ignore[attr-defined]

    def get_queryset(self) -> QuerySet:
        return scope_to_user(self.get_base_queryset(), user=self.request.user, workspace_field=self.workspace_field)

    def get_workspace_from_request(self, workspace_id: Any) -> Workspace:
        """The workspace named in a write request, if the user is a member; 404 otherwise."""
        try:
            return workspace_list(user=self.request.user).get(pk=workspace_id)
        except (Workspace.DoesNotExist, ValueError, TypeError):
            raise NotFound("Workspace not found.") from None


def require_operator(user: Any, workspace: Workspace, *, what: str = "do this") -> None:
    """Raise 403 unless `user` is Owner or Admin of `workspace` ("Only workspace Owners and Admins can <what>.")."""
    if not can_operate(user, workspace):
        raise PermissionDenied(f"Only workspace Owners and Admins can {what}.")


def require_editor(user: Any, workspace: Workspace, *, what: str = "do this") -> None:
    """Raise 403 unless `user` may run workloads in `workspace`: Owner, Admin or Member (endpoints, training
    jobs, Tune experiments, Serve deployments). "Only workspace Owners, Admins and Members can <what>."."""
    if not can_edit(user, workspace):
        raise PermissionDenied(f"Only workspace Owners, Admins and Members can {what}.")

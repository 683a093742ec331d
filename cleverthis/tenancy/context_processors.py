"""Template context shared by every page."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from cleverthis.dispatch_health import dispatch_status
from cleverthis.tenancy.selectors import workspace_list


def workspaces(request: HttpRequest) -> dict[str, Any]:
    """The signed-in user's workspaces, for the sidebar's workspace switcher."""
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {"user_workspaces": []}
    return {"user_workspaces": workspace_list(user=request.user)}


def dispatch(request: HttpRequest) -> dict[str, Any]:
    """`dispatch`: whether commands are being dispatched, for the pages' banner (read from the broker only
    when a template uses it: the base page of a signed-in user)."""
    return {"dispatch": SimpleLazyObject(dispatch_status)}

"""Template context shared by every page."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from tenancy.selectors import workspace_list


def workspaces(request: HttpRequest) -> dict[str, Any]:
    """The signed-in user's workspaces, for the sidebar's workspace switcher."""
    if not getattr(request, "user", None) or not request.user.is_authenticated:
        return {"user_workspaces": []}
    return {"user_workspaces": workspace_list(user=request.user)}

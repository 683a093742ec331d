"""Small display filters for fleet pages."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.filter
def gb(megabytes: int | float | None) -> str:
    """Megabytes as gigabytes with one decimal ("—" for nothing)."""
    if not megabytes:
        return "0"
    return f"{megabytes / 1024:.1f}"


@register.filter
def pct(value: float | None) -> str:
    """A percentage without decimals."""
    return f"{value or 0:.0f}%"


@register.filter
def agent_state(node: Any) -> str:
    """ "current", "update available" or "too old to update itself" for a node's agent ("" when unknown)."""
    from fleet import agent_updates

    if not node.agent_version:
        return ""
    if agent_updates.is_current(node):
        return "current"
    if 0 < node.protocol_version < agent_updates.UPDATABLE_FROM_PROTOCOL:
        return "too old to update itself: re-run the install script"
    return "update available"

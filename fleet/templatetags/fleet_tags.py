"""Small display filters for fleet pages."""

from __future__ import annotations

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

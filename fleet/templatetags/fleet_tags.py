"""Small display filters for fleet pages."""

from __future__ import annotations

import datetime as dt

from django import template
from django.utils import timezone

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
def ago(moment: dt.datetime | None) -> str:
    """How long ago `moment` was, in the largest whole unit ("12 s ago", "3 min ago"; "never" for nothing)."""
    if moment is None:
        return "never"
    seconds = max(0, int((timezone.now() - moment).total_seconds()))
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            count = seconds // size
            return f"{count} {unit}{'s' if unit == 'day' and count != 1 else ''} ago"
    return f"{seconds} s ago"

"""Small display filters for fleet pages, and the attributes of live (polling) fragments."""

from __future__ import annotations

from django import template
from django.utils.html import format_html
from django.utils.safestring import mark_safe

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


@register.simple_tag
def live(url: str, every: int | None, swap: str = "outerHTML") -> str:
    """The attributes of a live fragment: poll `url` every `every` seconds, or mark it settled."""
    if not every:
        return mark_safe('data-live="settled"')
    return format_html('hx-get="{}" hx-trigger="every {}s" hx-swap="{}" data-live="{}"', url, every, swap, every)


@register.filter
def last_line(text: str | None) -> str:
    """The last non-empty line of a (multi-line) message, e.g. a traceback's exception."""
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


@register.filter
def multiline(text: str | None) -> bool:
    """Whether a message has more than one non-empty line."""
    return len([line for line in (text or "").splitlines() if line.strip()]) > 1

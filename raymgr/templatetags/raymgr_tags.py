"""Template filters of the Ray pages."""

from __future__ import annotations

from django import template

from raymgr.logtext import console_text as _console_text

register = template.Library()


@register.filter
def console_text(text: str | None) -> str:
    """Logs without terminal escape codes and ``CTFLEET`` marker lines (`raymgr.logtext.console_text`)."""
    return _console_text(text)

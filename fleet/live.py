"""Pages that update themselves: a fragment polls (htmx) while what it shows is in progress.

A live fragment carries `hx-get`/`hx-trigger="every Ns"` only while it polls; once what it shows has
settled it is rendered without them, and the poll that brought it gets HTTP 286 (htmx stops polling
that element). Why polling rather than server push: docs/architecture.md, "Live pages".
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

FAST = 3  # seconds: something is changing right now (a command, a cluster starting, a running job)
SLOW = 30  # seconds: a settled page whose facts still drift (node telemetry, a serving deployment)


def poll_every(*, changing: bool, watched: bool = False) -> int | None:
    """How often a fragment polls: FAST while changing, SLOW while merely watched, else never."""
    if changing:
        return FAST
    return SLOW if watched else None


def respond(
    request: HttpRequest,
    template: str,
    context: dict[str, Any],
    *,
    element_id: str,
    every: int | None,
    status: int = 200,
) -> HttpResponse:
    """Render the fragment; a poll from `element_id` that finds it settled gets 286 (stop polling)."""
    response = render(request, template, {**context, "live_every": every}, status=status)
    if every is None and request.headers.get("HX-Trigger") == element_id and status == 200:
        response.status_code = 286
    return response

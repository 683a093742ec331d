"""The process's health for load balancers and operators: `/healthz`, and the pages' dispatch banner.

Both read the broker (`cleverthis.dispatch_health`), which is the root's business: no app imports this.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils.functional import SimpleLazyObject
from django.views.decorators.cache import never_cache

from cleverthis.dispatch_health import dispatch_status
from kernel import draining


@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness and database check for load balancers and the start-up script, plus dispatch at a glance.

    `status` is "ok" whenever this process and the database answer (so a load balancer keeps a replica
    whose worker is gone), and "draining" with HTTP 503 from the moment this process is asked to stop
    (`kernel.draining`): the load balancer takes it out before it stops accepting; `dispatch` says whether
    commands are being dispatched: the broker answers, the
    worker's last heartbeat, the queue depths (`cleverthis.dispatch_health`).
    """
    if draining.is_draining():
        return JsonResponse({"status": "draining"}, status=503)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok", "dispatch": dispatch_status().as_json()})


@login_required
@never_cache
def dispatch_banner(request: HttpRequest) -> HttpResponse:
    """The pages' "commands are not being dispatched" banner, polled by every page of a signed-in user."""
    return render(request, "dispatch_banner.html")


def dispatch(request: HttpRequest) -> dict[str, Any]:
    """Template context `dispatch`: whether commands are being dispatched, for the pages' banner (read from
    the broker only when a template uses it: the base page of a signed-in user)."""
    return {"dispatch": SimpleLazyObject(dispatch_status)}

"""Pages that belong to no single app: the dashboard, the workspaces list and sign-in."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.debug import sensitive_post_parameters

from cleverthis.dispatch_health import dispatch_status
from cleverthis.overview import fleet_overview
from cleverthis.throttling import sign_in_throttled


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    """Home: the fleet at a glance per workspace of the user (nodes, GPUs, running work, recent failures)."""
    return render(request, "tenancy/dashboard.html", {"workspaces": fleet_overview(user=request.user)})


@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness and database check for load balancers and the start-up script, plus dispatch at a glance.

    `status` is "ok" whenever this process and the database answer (so a load balancer keeps a replica
    whose worker is gone); `dispatch` says whether commands are being dispatched: the broker answers, the
    worker's last heartbeat, the queue depths (`cleverthis.dispatch_health`).
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok", "dispatch": dispatch_status().as_json()})


@login_required
@never_cache
def dispatch_banner(request: HttpRequest) -> HttpResponse:
    """The pages' "commands are not being dispatched" banner, polled by every page of a signed-in user."""
    return render(request, "dispatch_banner.html")


class SignInView(auth_views.LoginView):
    """Django's sign-in page; a POST over SIGN_IN_RATE (per client IP or username) gets a 429 page."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return sign_in_throttled(request) or super().post(request, *args, **kwargs)


@sensitive_post_parameters()
@never_cache
def admin_sign_in(request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
    """The admin's sign-in page, under the same SIGN_IN_RATE counters as the site's."""
    return sign_in_throttled(request) or admin.site.login(request, extra_context)

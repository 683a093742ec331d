"""Pages that belong to no single app: the dashboard and the workspaces list."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from cleverthis.tenancy.selectors import workspace_list


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    """Landing page after sign-in: the user's workspaces and where to go next."""
    return render(request, "tenancy/dashboard.html", {"workspaces": workspace_list(user=request.user)})


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness and database check for load balancers and the start-up script."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})

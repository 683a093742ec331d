"""Compute pages."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


@login_required
def cluster_list(request: HttpRequest) -> HttpResponse:
    """Settings → Compute: the workspace's compute clusters."""
    return render(request, "fleet/cluster_list.html", {"clusters": []})

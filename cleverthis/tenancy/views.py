"""Pages of the tenancy app: sign-in (site and admin), a workspace's quotas.

The home page reads every app, so it lives in the root (`cleverthis.overview`); so do the health check
and the dispatch banner (`cleverthis.health`), which read the broker.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.debug import sensitive_post_parameters

from cleverthis.tenancy import services
from cleverthis.tenancy.forms import QuotaForm
from cleverthis.tenancy.permissions import is_owner
from cleverthis.tenancy.quotas import limits_of, quota_report
from cleverthis.tenancy.selectors import workspace_list
from kernel.throttling import sign_in_throttled


class SignInView(auth_views.LoginView):
    """Django's sign-in page; a POST over SIGN_IN_RATE (per client IP or username) gets a 429 page."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return sign_in_throttled(request) or super().post(request, *args, **kwargs)


@sensitive_post_parameters()
@never_cache
def admin_sign_in(request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
    """The admin's sign-in page, under the same SIGN_IN_RATE counters as the site's."""
    return sign_in_throttled(request) or admin.site.login(request, extra_context)


@login_required
def workspace_quotas(request: HttpRequest, pk: Any) -> HttpResponse:
    """A workspace's quotas with what is in use; its Owner changes the limits here (others: 403 on POST)."""
    workspace = get_object_or_404(workspace_list(user=request.user), pk=pk)
    owner = is_owner(request.user, workspace)
    status = 200
    if request.method == "POST":
        if not owner:
            raise PermissionDenied("Only the workspace's Owner can change its quotas.")
        form = QuotaForm(request.POST)
        if form.is_valid():
            try:
                services.workspace_quota_set(actor=request.user, workspace=workspace, limits=form.cleaned_data)
            except ValidationError as exc:
                for field, errors in exc.message_dict.items():
                    form.add_error(field if field in form.fields else None, errors)
            else:
                messages.success(request, f"Quotas of {workspace.name} saved.")
                return redirect("workspace-quota-page", pk=workspace.pk)
        status = 400
    else:
        form = QuotaForm(initial=limits_of(getattr(workspace, "quota", None)))
    context = {
        "workspace": workspace,
        "form": form,
        "can_edit": owner,
        "lines": quota_report([workspace.pk])[workspace.pk],
    }
    return render(request, "tenancy/quotas.html", context, status=status)

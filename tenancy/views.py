"""Pages of the tenancy app: sign-in (site and admin, local passwords and OpenID Connect), sign-out, and a
workspace's quotas.

The home page reads every app, so it lives in the root (`cleverthis.overview`); so do the health check
and the dispatch banner (`cleverthis.health`), which read the broker.
"""

from __future__ import annotations

import logging
from typing import Any

import requests
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, SuspiciousOperation, ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.debug import sensitive_post_parameters
from django.views.generic import View
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from kernel.throttling import sign_in_throttled
from tenancy import oidc, services
from tenancy.forms import QuotaForm
from tenancy.models import SsoIdentity
from tenancy.permissions import is_owner
from tenancy.quotas import limits_of, quota_report
from tenancy.selectors import workspace_list

logger = logging.getLogger(__name__)
SSO_FAILED = "Single sign-on did not complete: {reason}. Try again, or sign in with a password."


class SignInView(auth_views.LoginView):
    """Django's sign-in page, with "Sign in with <provider>" when OIDC is configured; a POST over
    SIGN_IN_RATE (per client IP or username) gets a 429 page."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return sign_in_throttled(request) or super().post(request, *args, **kwargs)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        return {
            **super().get_context_data(**kwargs),
            "oidc_enabled": settings.OIDC_ENABLED,
            "oidc_name": settings.OIDC_DISPLAY_NAME,
        }


class SignOutView(auth_views.LogoutView):
    """Ends the session; a session that came from the provider goes on to the provider's logout
    (RP-initiated logout), which sends the browser back to the sign-in page."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        provider_logout = oidc.provider_logout_url(request)  # read the ID token before the session ends
        response = super().post(request, *args, **kwargs)
        return HttpResponseRedirect(provider_logout) if provider_logout else response


class SsoStartView(OIDCAuthenticationRequestView):
    """Sends the browser to the provider's authorization endpoint (state, nonce, PKCE: the library)."""

    def __init__(self, **kwargs: Any) -> None:
        View.__init__(self, **kwargs)  # the endpoint is looked up per request, not at construction

    def get(self, request: HttpRequest) -> HttpResponse:
        if not settings.OIDC_ENABLED:
            raise Http404("single sign-on is not configured")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = oidc.provider_endpoints().authorization
        except oidc.ProviderUnavailable as exc:
            logger.warning("single sign-on cannot start: %s", exc)
            messages.error(request, SSO_FAILED.format(reason="the sign-in provider cannot be reached"))
            return redirect("login")
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        return super().get(request)


class SsoCallbackView(OIDCAuthenticationCallbackView):
    """The provider's redirect back: the library exchanges the code and signs the user in; failures come
    back to the sign-in page with the reason, a user with no workspace to `sso_no_workspace`."""

    def get(self, request: HttpRequest) -> HttpResponse:
        if not settings.OIDC_ENABLED:
            raise Http404("single sign-on is not configured")
        try:
            return super().get(request)
        except (oidc.ProviderUnavailable, requests.RequestException, SuspiciousOperation) as exc:
            logger.warning("single sign-on failed: %s", exc)
            return self._failure("the sign-in provider's answer could not be verified")

    def login_failure(self) -> HttpResponse:
        reason = (
            self.request.GET.get("error_description") or self.request.GET.get("error") or "sign-in was not accepted"
        )
        return self._failure(reason[:200])

    def _failure(self, reason: str) -> HttpResponse:
        messages.error(self.request, SSO_FAILED.format(reason=reason))
        return redirect("login")

    def login_success(self) -> HttpResponse:
        response = super().login_success()
        if not self.user.memberships.exists():
            return redirect("sso-no-workspace")
        return response


@login_required
def sso_no_workspace(request: HttpRequest) -> HttpResponse:
    """Signed in through the provider, but no workspace: says why (the mapped claim's values) and what to do."""
    identity = SsoIdentity.objects.filter(user=request.user).first()
    context = {
        "identity": identity,
        "claim": settings.OIDC_GROUPS_CLAIM,
        "has_workspace": request.user.memberships.exists(),
        "dashboard_url": reverse("dashboard"),
    }
    return render(request, "tenancy/sso_no_workspace.html", context)


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

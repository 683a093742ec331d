"""Pages of the tenancy app: sign-in (site and admin).

The home page reads every app, so it lives in the root (`cleverthis.overview`); so do the health check
and the dispatch banner (`cleverthis.health`), which read the broker.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.debug import sensitive_post_parameters

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

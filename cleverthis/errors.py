"""The product's pages for a refused request: a missing right (403) and a failed CSRF check.

Both say why in words and link back to where the user came from (the Referer when it is this site, else
the home page), instead of a bare "403 Forbidden". An htmx request gets the reason as a message put at the
top of the page (`HX-Retarget: main`), leaving the page as it was; an API path gets JSON `{"detail": …}`.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils.http import url_has_allowed_host_and_scheme

CSRF_REASON = (
    "This form was refused because it did not carry this site's security token: it was open too long "
    "(you signed in again since), or it came from another site. Go back, reload the page and send it again."
)
DENIED_REASON = "Your role in this workspace does not allow this."


def _back_url(request: HttpRequest) -> str:
    """Where the link back goes: the page the request came from when it is on this site, else home."""
    referer = request.headers.get("Referer", "")
    if referer and url_has_allowed_host_and_scheme(
        referer, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return referer
    return "/"


def refused(request: HttpRequest, reason: str, *, title: str) -> HttpResponse:
    """A 403 that says `reason` and links back (see the module)."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": reason}, status=403)
    context = {"title": title, "reason": reason, "back_url": _back_url(request)}
    if request.headers.get("HX-Request") == "true":
        response = render(request, "_refused.html", context, status=403)
        response["HX-Retarget"] = "main"
        response["HX-Reswap"] = "afterbegin"
        return response
    return render(request, "403.html", context, status=403)


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """handler403: the reason the view gave (`PermissionDenied("Only workspace Owners …")`)."""
    reason = str(exception or "").strip() or DENIED_REASON
    return refused(request, reason, title="Not allowed")


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: a stale or forged form, said in words (Django's own reason is for developers)."""
    return refused(request, CSRF_REASON, title="Form expired or not from this site")

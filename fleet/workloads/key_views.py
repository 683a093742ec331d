"""Settings → API keys: a member's own keys (create shows the secret once, with a copy button; revoke)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from fleet.workloads import selectors
from fleet.workloads import services as workload_services
from kernel.exceptions import IllegalTransition
from tenancy.models import ApiKey, ApiKeyScope
from tenancy.selectors import workspace_list


class _EndpointChoices(forms.ModelMultipleChoiceField):
    """Endpoints as checkboxes named the way the Endpoints page names them, with their workspace."""

    def label_from_instance(self, obj: Any) -> str:
        return f"endpoint-{obj.slug} ({obj.model_id}) · {obj.cluster.workspace.name}"


class ApiKeyForm(forms.Form):
    """A new key: its workspace, name, scopes, and optionally endpoints, expiry and limits."""

    workspace = forms.ModelChoiceField(queryset=None, empty_label=None)
    name = forms.CharField(max_length=100)
    scopes = forms.MultipleChoiceField(
        choices=ApiKeyScope.choices, widget=forms.CheckboxSelectMultiple, initial=[ApiKeyScope.INVOKE]
    )
    endpoints = _EndpointChoices(
        queryset=None,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Only these endpoints",
        help_text="Tick none for every endpoint of the workspace.",
    )
    expires_at = forms.DateTimeField(
        required=False, label="Expires (UTC)", widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )
    requests_per_min = forms.IntegerField(
        required=False, min_value=1, max_value=workload_services.MAX_PER_MINUTE, label="Requests per minute"
    )
    tokens_per_min = forms.IntegerField(
        required=False, min_value=1, max_value=workload_services.MAX_PER_MINUTE, label="Tokens per minute"
    )

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["workspace"].queryset = workspace_list(user=user)
        self.fields["endpoints"].queryset = (
            selectors.endpoint_list(user=user).select_related("cluster__workspace").order_by("model_id", "slug")
        )


# The secret of a key just created waits here, in the creator's session, for the one page that shows it.
CREATED_SESSION_KEY = "api_key_created"


def _page(request: HttpRequest, form: ApiKeyForm, status: int = 200) -> HttpResponse:
    keys = ApiKey.objects.filter(user=request.user).select_related("workspace").order_by("-created_at")
    created = None
    shown = request.session.pop(CREATED_SESSION_KEY, None)  # shown once: gone from the session now
    if shown:
        key = keys.filter(pk=shown["id"]).first()
        created = (key, shown["secret"]) if key is not None else None
    context = {"form": form, "keys": keys, "created": created}
    return render(request, "workloads/api_keys.html", context, status=status)


@login_required
@never_cache  # Cache-Control: no-store: the page that shows a secret is never kept by a browser or proxy
def api_key_list(request: HttpRequest) -> HttpResponse:
    """Your keys, with last use. POST creates one, then redirects (POST-redirect-GET: reloading the page
    never makes a second key) to the list, which shows the new secret this once (kept in the session
    only until that page is rendered)."""
    if request.method != "POST":
        return _page(request, ApiKeyForm(user=request.user))
    form = ApiKeyForm(request.POST, user=request.user)
    if not form.is_valid():
        return _page(request, form, status=400)
    values = form.cleaned_data
    endpoints = [e for e in values["endpoints"] if e.cluster.workspace_id == values["workspace"].pk]
    try:
        key, secret = workload_services.api_key_create(
            actor=request.user,
            workspace=values["workspace"],
            name=values["name"],
            scopes=values["scopes"],
            endpoints=endpoints,
            expires_at=values["expires_at"],
            requests_per_min=values["requests_per_min"],
            tokens_per_min=values["tokens_per_min"],
        )
    except ValidationError as exc:
        for field, errors in exc.message_dict.items():
            form.add_error(field if field in form.fields else None, errors)
        return _page(request, form, status=400)
    request.session[CREATED_SESSION_KEY] = {"id": key.pk, "secret": secret}
    return redirect("workloads:api_key_list")


@login_required
@require_POST
def api_key_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    """Revoke one of your keys."""
    key = get_object_or_404(ApiKey, pk=pk, user=request.user)
    try:
        workload_services.api_key_revoke(actor=request.user, key=key)
    except (IllegalTransition, PermissionDenied) as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"API key {key.name} revoked.")
    return redirect("workloads:api_key_list")

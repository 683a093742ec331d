"""Settings → API keys: a member's own keys (create shows the secret once, with a copy button; revoke)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from fleet.workloads import selectors
from fleet.workloads import services as workload_services
from kernel.exceptions import IllegalTransition
from tenancy.models import ApiKey, ApiKeyScope
from tenancy.selectors import workspace_list


class ApiKeyForm(forms.Form):
    """A new key: its workspace, name, scopes, and optionally endpoints, expiry and limits."""

    workspace = forms.ModelChoiceField(queryset=None, empty_label=None)
    name = forms.CharField(max_length=100)
    scopes = forms.MultipleChoiceField(
        choices=ApiKeyScope.choices, widget=forms.CheckboxSelectMultiple, initial=[ApiKeyScope.INVOKE]
    )
    endpoints = forms.ModelMultipleChoiceField(
        queryset=None, required=False, help_text="Leave empty for every endpoint of the workspace."
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
        self.fields["endpoints"].queryset = selectors.endpoint_list(user=user).order_by("model_id")


def _page(request: HttpRequest, form: ApiKeyForm, created: tuple[ApiKey, str] | None = None) -> HttpResponse:
    keys = ApiKey.objects.filter(user=request.user).select_related("workspace").order_by("-created_at")
    context = {"form": form, "keys": keys, "created": created}
    response = render(request, "workloads/api_keys.html", context)
    if created is not None:  # the page holds the new key's secret: never kept by a browser or a proxy
        response["Cache-Control"] = "no-store"
        response["Pragma"] = "no-cache"
    return response


@login_required
def api_key_list(request: HttpRequest) -> HttpResponse:
    """Your keys, with last use; POST creates one and shows its secret this once."""
    if request.method != "POST":
        return _page(request, ApiKeyForm(user=request.user))
    form = ApiKeyForm(request.POST, user=request.user)
    if not form.is_valid():
        return _page(request, form)
    values = form.cleaned_data
    endpoints = [e for e in values["endpoints"] if e.cluster.workspace_id == values["workspace"].pk]
    try:
        created = workload_services.api_key_create(
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
        return _page(request, form)
    return _page(request, ApiKeyForm(user=request.user), created)


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

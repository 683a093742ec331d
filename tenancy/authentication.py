"""DRF authentication by API key (`Authorization: Bearer ctk_…`, or `Token ctk_…`).

The request's user is the key's owner carrying its `KeyGrant` (`user.api_key_grant`), which the role
checks (`tenancy.permissions`) and the workspace scoping (`tenancy.selectors`) honour: a key reaches only
its workspace, reads need the read (or operate) scope, and every other method needs operate. A key that
may only invoke endpoints is refused on the API. Older DRF tokens (`Token <40 hex>`) are left to DRF's
TokenAuthentication.
"""

from __future__ import annotations

import time
from typing import Any

from django.contrib.auth import get_user_model
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from kernel.client_address import request_client_ip
from tenancy import api_keys
from tenancy.models import ApiKeyScope

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class ApiKeyAuthentication(BaseAuthentication):
    """Authenticate with an API key; its rights are its scopes within its owner's current role."""

    def authenticate(self, request: Request) -> tuple[Any, api_keys.KeyGrant] | None:
        raw = api_keys.key_from_authorization(get_authorization_header(request).decode("latin-1"))
        if raw is None:
            return None
        grant = api_keys.grant_for(raw)
        if grant is None or (grant.expires_at is not None and grant.expires_at <= time.time()):
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked API key.")
        user = get_user_model().objects.filter(pk=grant.user_id, is_active=True).first()
        if user is None:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked API key.")
        needed = ApiKeyScope.READ if request.method in SAFE_METHODS else ApiKeyScope.OPERATE
        if not grant.allows(needed):
            raise exceptions.PermissionDenied(f"This API key lacks the {needed} scope.")
        user.api_key_grant = grant
        if api_keys.last_use_due(grant.key_id):
            api_keys.record_last_use(grant.key_id, request_client_ip(request))
        return user, grant

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class ApiKeyScheme(OpenApiAuthenticationExtension):
    """The schema's name for API-key authentication: HTTP bearer."""

    target_class = ApiKeyAuthentication
    name = "apiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key from Settings → API keys: `Authorization: Bearer ctk_…`.",
        }

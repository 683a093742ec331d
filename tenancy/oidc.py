"""OpenID Connect sign-in on mozilla-django-oidc: where the provider's endpoints are, the authentication
backend, and the provider's logout URL.

The library does the protocol (authorization-code flow with state, nonce and PKCE; the token request;
the ID token's signature against the provider's JWKS). This module adds what it lacks: endpoints from the
provider's discovery document, fetched at the first sign-in and kept per process (never at import, so
a process starts whether or not the provider answers); checks of the ID token's issuer and audience;
users matched by issuer and subject (`services.sso_sign_in`) instead of by e-mail.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest
from django.urls import reverse
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from tenancy import services

logger = logging.getLogger(__name__)


class ProviderUnavailable(Exception):
    """The provider's discovery document could not be fetched or lacks an endpoint we need."""


@dataclass(frozen=True)
class ProviderEndpoints:
    """The provider's issuer and endpoints: explicit settings first, then its discovery document."""

    issuer: str
    authorization: str
    token: str
    userinfo: str
    jwks: str
    end_session: str


@functools.lru_cache(maxsize=4)
def _discovery_document(url: str) -> dict[str, Any]:
    """The discovery document at `url`, once per process (a failure is not cached: the next sign-in retries)."""
    try:
        response = requests.get(url, timeout=settings.OIDC_TIMEOUT, verify=settings.OIDC_VERIFY_SSL)
        response.raise_for_status()
        document = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise ProviderUnavailable(f"cannot read the OpenID Connect discovery document at {url}: {exc}") from exc
    if not isinstance(document, dict):
        raise ProviderUnavailable(f"the discovery document at {url} is not a JSON object")
    return document


def provider_endpoints() -> ProviderEndpoints:
    """The endpoints to use now; may fetch the discovery document (raises ProviderUnavailable)."""
    explicit = {
        "authorization_endpoint": settings.OIDC_OP_AUTHORIZATION_ENDPOINT,
        "token_endpoint": settings.OIDC_OP_TOKEN_ENDPOINT,
        "userinfo_endpoint": settings.OIDC_OP_USER_ENDPOINT,
        "jwks_uri": settings.OIDC_OP_JWKS_ENDPOINT,
        "end_session_endpoint": settings.OIDC_OP_END_SESSION_ENDPOINT,
    }
    found = {"issuer": settings.OIDC_ISSUER}
    if settings.OIDC_DISCOVERY_URL:
        document = _discovery_document(settings.OIDC_DISCOVERY_URL)
        found = {key: str(document.get(key) or "") for key in ["issuer", *explicit]}
    found.update({key: value for key, value in explicit.items() if value})
    needed = ["authorization_endpoint", "token_endpoint", "userinfo_endpoint"]
    if settings.OIDC_RP_SIGN_ALGO.startswith(("RS", "ES")):
        needed.append("jwks_uri")
    missing = [key for key in needed if not found.get(key)]
    if missing:
        raise ProviderUnavailable(f"the provider names no {', '.join(missing)}")
    return ProviderEndpoints(
        issuer=found.get("issuer", ""),
        authorization=found["authorization_endpoint"],
        token=found["token_endpoint"],
        userinfo=found["userinfo_endpoint"],
        jwks=found.get("jwks_uri", ""),
        end_session=found.get("end_session_endpoint", ""),
    )


class OidcBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend with endpoints resolved at sign-in, issuer and audience checked, and
    users found or created by `services.sso_sign_in` (which applies the workspace claim mapping)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Django builds backends for every authenticate() and session check: no endpoint lookup here.
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.OIDC_RP_CLIENT_SECRET
        self.OIDC_RP_SIGN_ALGO = settings.OIDC_RP_SIGN_ALGO
        self.OIDC_RP_IDP_SIGN_KEY = None
        self.UserModel = get_user_model()

    OIDC_OP_TOKEN_ENDPOINT = property(lambda self: provider_endpoints().token)
    OIDC_OP_USER_ENDPOINT = property(lambda self: provider_endpoints().userinfo)
    OIDC_OP_JWKS_ENDPOINT = property(lambda self: provider_endpoints().jwks or None)

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> Any:
        """Only the provider's callback (a `code` and `state`) is ours; password sign-ins pass by."""
        if request is None or "code" not in request.GET or "state" not in request.GET or "nonce" not in kwargs:
            return None
        return super().authenticate(request, **kwargs)

    def verify_token(self, token: str, **kwargs: Any) -> dict[str, Any]:
        """The library checks signature and nonce; the ID token must also be for us, from our issuer."""
        payload = super().verify_token(token, **kwargs)
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if self.OIDC_RP_CLIENT_ID not in audiences:
            raise SuspiciousOperation("the ID token is not for this client (aud)")
        issuer = provider_endpoints().issuer
        if issuer and payload.get("iss") != issuer:
            raise SuspiciousOperation("the ID token comes from another issuer (iss)")
        return payload

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        """The user of the ID token's subject, created at the first sign-in, memberships mapped."""
        userinfo = self.get_userinfo(access_token, id_token, payload)
        if userinfo.get("sub") != payload.get("sub"):
            raise SuspiciousOperation("the userinfo subject differs from the ID token's")
        return services.sso_sign_in(
            issuer=str(payload.get("iss") or ""),
            subject=str(payload["sub"]),
            claims={**payload, **userinfo},
            mapping=settings.OIDC_WORKSPACE_MAP,
            groups_claim=settings.OIDC_GROUPS_CLAIM,
            username_claim=settings.OIDC_USERNAME_CLAIM,
        )


def provider_logout_url(request: HttpRequest) -> str:
    """Where to send a user signed in through the provider after signing out here: the provider's
    end_session_endpoint (RP-initiated logout) coming back to the sign-in page; "" when the session did
    not come from the provider, or the provider offers no such endpoint (or cannot be reached)."""
    id_token = request.session.get("oidc_id_token")
    if not settings.OIDC_ENABLED or not id_token:
        return ""
    try:
        end_session = provider_endpoints().end_session
    except ProviderUnavailable as exc:
        logger.warning("no provider logout: %s", exc)
        return ""
    if not end_session:
        return ""
    query = urlencode(
        {
            "id_token_hint": id_token,
            "client_id": settings.OIDC_RP_CLIENT_ID,
            "post_logout_redirect_uri": request.build_absolute_uri(reverse("login")),
        }
    )
    return f"{end_session}{'&' if '?' in end_session else '?'}{query}"

"""Who is calling, for ASGI code that runs outside Django's request cycle (the tunnel proxy).

Accepts the same credentials as the API: the session cookie, or an API token as
`Authorization: Token <key>` (or `Bearer <key>`).
"""

from __future__ import annotations

from http.cookies import SimpleCookie
from importlib import import_module
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user
from django.contrib.auth.models import AnonymousUser

from kernel.asgi_scope import header


class _SessionOnly:
    """The one attribute `django.contrib.auth.get_user` reads from a request."""

    def __init__(self, session: Any) -> None:
        self.session = session


def user_from_scope(scope: dict[str, Any]) -> Any:
    """The authenticated user of an ASGI HTTP scope, or AnonymousUser (call from sync code)."""
    authorization = header(scope, b"authorization")
    if authorization:
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() in ("token", "bearer") and key.strip():
            from rest_framework.authtoken.models import Token

            token = Token.objects.select_related("user").filter(key=key.strip()).first()
            if token is not None and token.user.is_active:
                return token.user
        return AnonymousUser()
    cookie = SimpleCookie()
    try:
        cookie.load(header(scope, b"cookie"))
    except Exception:
        return AnonymousUser()
    morsel = cookie.get(settings.SESSION_COOKIE_NAME)
    if morsel is None:
        return AnonymousUser()
    engine = import_module(settings.SESSION_ENGINE)
    return get_user(_SessionOnly(engine.SessionStore(morsel.value)))

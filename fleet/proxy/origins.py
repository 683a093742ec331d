"""Origins of their own for everything nodes serve, and how a member's browser gets in.

What a node serves (an inference endpoint, a Ray Serve deployment, a Ray Dashboard) is proxied only on a
hostname of its own (named by `fleet.origin_names`: `endpoint-<slug>.<ENDPOINT_DOMAIN>`,
`serve-<deployment id>.<ENDPOINT_DOMAIN>`, `ray-<cluster id>.<RAY_DASHBOARD_DOMAIN>`), never on the
control plane's, so a workload's script runs on an origin that holds none of the control plane's cookies
and cannot act with a visitor's session. `*.localhost` names work in browsers without DNS for local use.

On those origins the control plane's session cookie is never used. Callers present an API token, or
a browser presents the origin cookie: a member who is signed in on the control plane follows a link
there, the control plane mints a short-lived single-use signed ticket for that one host and redirects
to `<origin>/__cleverthis/ticket?ticket=…&next=…`, and the proxy redeems it for a host-only cookie
(`ORIGIN_COOKIE`) naming the user and the host, checked again (signature, host, age, membership) on
every request. Neither the ticket nor the cookie can be used on another host.
"""

from __future__ import annotations

import secrets
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import quote, urlsplit

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.core import signing
from django.core.cache import cache

# The origins' names live in the core (models name their origin without loading the proxy); the kinds are
# re-exported here for the proxy's resolvers.
from fleet.origin_names import DASHBOARD as DASHBOARD
from fleet.origin_names import ENDPOINT as ENDPOINT
from fleet.origin_names import SERVE as SERVE
from fleet.origin_names import is_node_origin_host
from fleet.proxy import key_access
from kernel.asgi_scope import header

TICKET_PATH = "/__cleverthis/ticket"
ORIGIN_COOKIE = "cleverthis_origin"
_TICKET_SALT = "cleverthis.proxy.origin-ticket"
_COOKIE_SALT = "cleverthis.proxy.origin-cookie"


def request_host(scope: dict[str, Any]) -> str:
    """The request's Host without its port, lower-case."""
    host = header(scope, b"host").strip().lower()
    if host.startswith("["):  # an IPv6 literal
        return host.split("]", 1)[0] + "]"
    return host.rsplit(":", 1)[0] if ":" in host else host


def is_node_origin(scope: dict[str, Any]) -> bool:
    """Whether the request was made to an origin of node content (any kind)."""
    return is_node_origin_host(request_host(scope))


def origin_url(scope: dict[str, Any], host: str) -> str:
    """`scheme://host[:port]` for `host`, reached the way this request reached the control plane."""
    scheme = settings.NODE_ORIGIN_SCHEME or ("https" if scope.get("scheme") in ("https", "wss") else "http")
    raw = header(scope, b"host").strip()
    port = raw.rsplit(":", 1)[1] if ":" in raw and not raw.endswith("]") else ""
    return f"{scheme}://{host}" + (f":{port}" if port.isdigit() else "")


def safe_next(path: str) -> str:
    """`path` if it is a path on the same host (no scheme, no host, no `//`), else "/"."""
    if not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    parts = urlsplit(path)
    if parts.scheme or parts.netloc:
        return "/"
    return path


# ---- tickets: minted on the control plane, redeemed once on the node origin


def ticket_for(*, user_id: Any, host: str) -> str:
    """A signed ticket letting `user_id` into `host` once, within ORIGIN_TICKET_MAX_AGE_S."""
    return signing.dumps({"u": str(user_id), "h": host, "n": secrets.token_urlsafe(16)}, salt=_TICKET_SALT)


def ticket_redirect(scope: dict[str, Any], *, user_id: Any, host: str, next_path: str) -> str:
    """Where to send a signed-in member so that `host` lets them in and shows `next_path`."""
    ticket = ticket_for(user_id=user_id, host=host)
    return f"{origin_url(scope, host)}{TICKET_PATH}?ticket={quote(ticket)}&next={quote(safe_next(next_path))}"


def redeem_ticket(ticket: str, *, host: str) -> str | None:
    """The user id a valid, fresh, unused ticket for `host` names; None otherwise (it is used up now)."""
    try:
        data = signing.loads(ticket, salt=_TICKET_SALT, max_age=settings.ORIGIN_TICKET_MAX_AGE_S)
    except signing.BadSignature:
        return None
    if not isinstance(data, dict) or data.get("h") != host or not data.get("n"):
        return None
    # single use: the first redemption claims the nonce; the key outlives the ticket's validity
    if not cache.add(f"origin-ticket:{data['n']}", 1, timeout=settings.ORIGIN_TICKET_MAX_AGE_S + 5):
        return None
    return str(data.get("u", ""))


def origin_cookie_header(*, user_id: str, host: str, secure: bool) -> bytes:
    """The `Set-Cookie` value of the origin cookie: host-only (no Domain), HttpOnly, SameSite=Lax."""
    value = signing.dumps({"u": user_id, "h": host}, salt=_COOKIE_SALT)
    attributes = f"; Path=/; Max-Age={settings.ORIGIN_SESSION_MAX_AGE_S}; HttpOnly; SameSite=Lax"
    return f"{ORIGIN_COOKIE}={value}{attributes}{'; Secure' if secure else ''}".encode("latin-1")


def user_from_origin_cookie(scope: dict[str, Any]) -> Any:
    """The user the origin cookie of this request's host names, or AnonymousUser (sync: reads the DB)."""
    cookie = SimpleCookie()
    try:
        cookie.load(header(scope, b"cookie"))
    except Exception:
        return AnonymousUser()
    morsel = cookie.get(ORIGIN_COOKIE)
    if morsel is None:
        return AnonymousUser()
    try:
        data = signing.loads(morsel.value, salt=_COOKIE_SALT, max_age=settings.ORIGIN_SESSION_MAX_AGE_S)
    except signing.BadSignature:
        return AnonymousUser()
    if not isinstance(data, dict) or data.get("h") != request_host(scope):
        return AnonymousUser()
    user = get_user_model().objects.filter(pk=data.get("u"), is_active=True).first()
    return user or AnonymousUser()


def user_from_token(scope: dict[str, Any]) -> Any:
    """The user of an `Authorization: Token <key>` (or Bearer) header, or AnonymousUser (sync).

    An API key (`ctk_…`) counts when it holds the invoke scope and is not limited to chosen endpoints; its
    user carries the key's grant, so role checks keep to the key's workspace.
    """
    raw = key_access.presented_key(scope)
    if raw is not None:
        grant = key_access.load_key(raw)
        if grant is None or not grant.allows("invoke") or key_access.restricted(grant):
            return AnonymousUser()
        user = get_user_model().objects.filter(pk=grant.user_id, is_active=True).first()
        if user is None:
            return AnonymousUser()
        user.api_key_grant = grant
        key_access.mark_scope(scope, grant)
        return user
    scheme, _, key = header(scope, b"authorization").partition(" ")
    if scheme.lower() not in ("token", "bearer") or not key.strip():
        return AnonymousUser()
    from rest_framework.authtoken.models import Token

    token = Token.objects.select_related("user").filter(key=key.strip()).first()
    return token.user if token is not None and token.user.is_active else AnonymousUser()


def caller_on_origin(scope: dict[str, Any], *, tokens: bool = True) -> Any:
    """Who calls a node origin: an API token (when `tokens`), else the origin cookie; never a session."""
    if header(scope, b"authorization"):
        return user_from_token(scope) if tokens else AnonymousUser()
    return user_from_origin_cookie(scope)


# ---- what the proxy never lets through


def protected_cookie_names() -> frozenset[str]:
    """Cookies that belong to the control plane: never forwarded to a node, never set by one."""
    return frozenset(
        {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME, settings.LANGUAGE_COOKIE_NAME, ORIGIN_COOKIE}
    )


def csrf_header_name() -> bytes:
    """The request header carrying Django's CSRF token (`X-CSRFToken` by default), lower-case."""
    name = settings.CSRF_HEADER_NAME.removeprefix("HTTP_").replace("_", "-").lower()
    return name.encode("latin-1")


def node_set_cookie(value: bytes) -> bytes | None:
    """A node's `Set-Cookie` as the browser may see it: None for a control-plane cookie's name; any
    `Domain` attribute removed, so the cookie stays host-only on the node's own origin."""
    text = value.decode("latin-1")
    name_value, _, attributes = text.partition(";")
    name = name_value.split("=", 1)[0].strip()
    if not name or name in protected_cookie_names():
        return None
    kept = [a for a in attributes.split(";") if a.strip() and not a.strip().lower().startswith("domain")]
    return ";".join([name_value, *kept]).encode("latin-1")


def websocket_origin_allowed(scope: dict[str, Any]) -> bool:
    """A browser's WebSocket upgrade must come from the same node origin (no Origin: not a browser)."""
    origin = header(scope, b"origin").strip().lower()
    if not origin:
        return True
    host = urlsplit(origin).hostname or ""
    return host == request_host(scope)

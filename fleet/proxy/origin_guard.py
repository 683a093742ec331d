"""Request-level guards on node origins that hold for every kind (endpoints, Serve deployments, dashboards).

- Which requests change state: any method but GET, HEAD and OPTIONS (`is_safe_method`).
- Cross-origin requests: the origin cookie is SameSite=Lax, and all node origins (and often the control
  plane) sit under one parent domain, i.e. on one *site*, so a page on a sibling origin
  (`endpoint-<slug>.…`, a workload's own page) can send a state-changing request that carries the
  cookie. `from_elsewhere` tells such a request: one authenticated by the origin cookie (no
  `Authorization`) whose `Origin` (or, without one, `Referer`) is not this very origin (same host and
  port). A cookie request naming neither counts as from elsewhere: browsers send `Origin` with every
  POST/PUT/PATCH/DELETE, so only a non-browser would omit both, and a non-browser uses an API token.
  Token-authenticated clients are not browsers (nothing ambient is sent for them) and are not checked.
- Host names under the node-origin domains that name no node origin (`endpoint-zz.<ENDPOINT_DOMAIN>`,
  the bare domain): `under_node_domain`, so the proxy answers them 404 instead of passing them to Django.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from fleet import origin_names
from fleet.proxy import origins
from kernel.asgi_scope import header

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def is_safe_method(scope: dict[str, Any]) -> bool:
    """Whether the request only reads (a WebSocket upgrade is a GET)."""
    return str(scope.get("method", "GET")).upper() in SAFE_METHODS


def control_plane_host() -> str:
    """The host name (no port, lower-case) of CONTROL_PLANE_URL."""
    return (urlsplit(settings.CONTROL_PLANE_URL).hostname or "").lower()


def under_node_domain(host: str) -> bool:
    """Whether `host` (no port) is one of the node-origin domains or under one, and not the control plane's."""
    host = host.lower().rstrip(".")
    if not host or host == control_plane_host():
        return False
    return any(host == kind.domain or host.endswith("." + kind.domain) for kind in origin_names.KINDS)


def carries_origin_cookie(scope: dict[str, Any]) -> bool:
    """Whether the request sends the node origin's cookie (valid or not)."""
    names = (part.split("=", 1)[0].strip() for part in header(scope, b"cookie").split(";"))
    return origins.ORIGIN_COOKIE in names


def _port(scheme: str, port: str | int | None) -> int | None:
    if port in (None, ""):
        return _DEFAULT_PORTS.get(scheme)
    text = str(port)
    return int(text) if text.isdigit() else None


def same_origin(scope: dict[str, Any]) -> bool:
    """Whether the request's `Origin` (else `Referer`) names this request's host and port."""
    source = header(scope, b"origin").strip() or header(scope, b"referer").strip()
    if not source or source.lower() == "null":
        return False
    try:
        parts = urlsplit(source)
        source_host, source_port = (parts.hostname or "").lower(), parts.port
    except ValueError:  # a port that is no number
        return False
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not source_host:
        return False
    raw_host = header(scope, b"host").strip().lower()
    host_port = raw_host.rsplit(":", 1)[1] if ":" in raw_host and not raw_host.endswith("]") else ""
    return source_host == origins.request_host(scope) and _port(scheme, source_port) == _port(scheme, host_port)


def from_elsewhere(scope: dict[str, Any]) -> bool:
    """Whether this is a browser's state-changing request, carrying the origin cookie, that did not come
    from a page of this very origin (see the module's docstring)."""
    if scope.get("type") != "http" or is_safe_method(scope) or header(scope, b"authorization"):
        return False
    return carries_origin_cookie(scope) and not same_origin(scope)

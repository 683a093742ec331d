"""Which headers cross the proxy: the client's going up to a node without hop-by-hop ones or the control
plane's credentials (Authorization, its cookies, the CSRF header), and the node's coming down without
hop-by-hop ones or a `Set-Cookie` naming a control-plane cookie or reaching beyond the node's host."""

from __future__ import annotations

from typing import Any

from fleet.proxy import origins

HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"host",
    b"content-length",
}


def upstream_headers(scope: dict[str, Any]) -> list[tuple[bytes, bytes]]:
    """The client's headers minus hop-by-hop ones and the control plane's own credentials.

    The workload on the node must never see the caller's control-plane API token, cookies or CSRF
    token (it could act as the user): `Authorization` and the CSRF header are dropped and our cookies
    (session, CSRF, the node origin's own cookie) are cut from `Cookie`.
    """
    own_cookies = origins.protected_cookie_names()
    dropped = {b"authorization", origins.csrf_header_name()}
    headers = []
    for name, value in scope.get("headers", []):
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in dropped:
            continue
        if lower == b"cookie":
            kept = [
                part.strip()
                for part in value.decode("latin-1").split(";")
                if part.strip() and part.split("=", 1)[0].strip() not in own_cookies
            ]
            if not kept:
                continue
            value = "; ".join(kept).encode("latin-1")
        headers.append((lower, value))
    return headers


def downstream_headers(headers: Any) -> list[tuple[bytes, bytes]]:
    """The node's response headers the client may see: no hop-by-hop ones, no control-plane cookies."""
    out = []
    for name, value in headers:
        lower = name.lower()
        if lower in HOP_BY_HOP - {b"content-length"}:
            continue
        if lower == b"set-cookie":
            value = origins.node_set_cookie(bytes(value))
            if value is None:
                continue
        out.append((name, bytes(value)))
    return out

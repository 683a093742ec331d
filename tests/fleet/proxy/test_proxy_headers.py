"""What the proxy forwards to workloads on nodes: never the caller's control-plane credentials."""

from __future__ import annotations

from fleet.proxy.headers import upstream_headers


def scope(*headers: tuple[bytes, bytes]) -> dict:
    return {"type": "http", "headers": list(headers)}


def test_authorization_and_our_cookies_are_not_forwarded():
    forwarded = upstream_headers(
        scope(
            (b"authorization", b"Token secret-key"),
            (b"cookie", b"sessionid=abc; csrftoken=def; app_pref=dark"),
            (b"x-request-id", b"r1"),
        )
    )
    assert (b"authorization", b"Token secret-key") not in forwarded
    assert (b"cookie", b"app_pref=dark") in forwarded
    assert (b"x-request-id", b"r1") in forwarded


def test_cookie_header_holding_only_our_cookies_is_dropped():
    assert upstream_headers(scope((b"cookie", b"sessionid=abc"))) == []


def test_hop_by_hop_headers_are_dropped():
    forwarded = upstream_headers(scope((b"connection", b"keep-alive"), (b"upgrade", b"h2c"), (b"accept", b"*/*")))
    assert forwarded == [(b"accept", b"*/*")]

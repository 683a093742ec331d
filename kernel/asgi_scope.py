"""Reading an ASGI connection scope outside Django's request cycle (the tunnel proxy, its resolvers)."""

from __future__ import annotations

from typing import Any


def header(scope: dict[str, Any], name: bytes) -> str:
    """The first value of request header `name` (lower-case bytes), decoded, or ""."""
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return ""


# The API key a request to an endpoint was authenticated with (its `ApiKey` id, an int), set in the ASGI
# scope by whoever authenticates it; usage metering (`fleet.usage`) reads it to count usage per key.
API_KEY_ID_SCOPE_KEY = "cleverthis.api_key_id"


def api_key_id(scope: dict[str, Any]) -> int | None:
    """The id of the API key the request was authenticated with, or None (a session, a token, public)."""
    value = scope.get(API_KEY_ID_SCOPE_KEY)
    return value if isinstance(value, int) else None


# Who an endpoint request's per-key rate limits count against (`fleet.proxy.rate_limits`): an API key's id
# (int) or "u<user id>" for a signed-in member's origin cookie or an older DRF token; set by the endpoint
# route, read by usage metering so the answer's tokens are charged to the same caller.
RATE_CALLER_SCOPE_KEY = "cleverthis.rate_caller"


def rate_caller(scope: dict[str, Any]) -> int | str | None:
    """Who the request's rate limits count against, or None (a public endpoint, no limits)."""
    value = scope.get(RATE_CALLER_SCOPE_KEY)
    return value if isinstance(value, int | str) else None

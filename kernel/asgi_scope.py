"""Reading an ASGI connection scope outside Django's request cycle (the tunnel proxy, its resolvers)."""

from __future__ import annotations

from typing import Any

# The id of the API key that authenticated an endpoint request (set by the proxy), for metering per key.
API_KEY_ID_SCOPE_KEY = "cleverthis.api_key_id"


def header(scope: dict[str, Any], name: bytes) -> str:
    """The first value of request header `name` (lower-case bytes), decoded, or ""."""
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return ""

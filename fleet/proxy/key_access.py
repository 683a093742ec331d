"""API keys on endpoint origins: who a key stands for, whether it may invoke an endpoint, its limits.

A key needs the invoke scope, its workspace must be the endpoint's, its owner must still be a member
(any role), and a key limited to chosen endpoints reaches only those. The key's rights come from
`tenancy.api_keys` (cached for API_KEY_CACHE_S); the endpoints a key is limited to never
change after creation, so they are kept per process until the key's rights are re-read empty.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from fleet.proxy.rate_limits import Limits
from fleet.workloads.models import ApiKeyEndpoint
from kernel.asgi_scope import API_KEY_ID_SCOPE_KEY, header
from kernel.client_address import scope_client_ip
from tenancy import api_keys
from tenancy.api_keys import MISSING, KeyGrant
from tenancy.models import ApiKeyScope

_CACHE_MAX = 10_000
_restrictions: dict[int, frozenset[UUID] | None] = {}  # key id → endpoints it is limited to (None: all)


def presented_key(scope: dict[str, Any]) -> str | None:
    """The API key the request's Authorization header carries, else None."""
    return api_keys.key_from_authorization(header(scope, b"authorization"))


def _restriction(key_id: int) -> frozenset[UUID] | None:
    """The endpoints `key_id` is limited to (sync: reads them the first time)."""
    if key_id not in _restrictions:
        rows = list(ApiKeyEndpoint.objects.filter(key_id=key_id).values_list("endpoint_id", flat=True))
        if len(_restrictions) >= _CACHE_MAX:
            _restrictions.clear()
        # no rows: every endpoint; rows whose endpoint was deleted (NULL) still limit the key
        _restrictions[key_id] = frozenset(r for r in rows if r is not None) if rows else None
    return _restrictions[key_id]


def cached_key(raw: str) -> KeyGrant | Any | None:
    """The key's grant if everything about it is cached (no database), else MISSING."""
    grant = api_keys.cached_grant(raw)
    if grant is MISSING or (grant is not None and grant.key_id not in _restrictions):
        return MISSING
    return grant


def load_key(raw: str) -> KeyGrant | None:
    """The key's grant, reading the database where the cache has nothing fresh (sync)."""
    grant = api_keys.grant_for(raw)
    if grant is not None:
        _restriction(grant.key_id)
    return grant


def may_invoke(grant: KeyGrant | None, workspace_id: Any, endpoint_id: UUID) -> bool:
    """Whether `grant` lets its owner invoke the endpoint `endpoint_id` of `workspace_id` (cached facts only)."""
    if grant is None or grant.workspace_id != workspace_id or not grant.allows(ApiKeyScope.INVOKE):
        return False
    allowed = _restrictions.get(grant.key_id)
    return allowed is None or endpoint_id in allowed


def restricted(grant: KeyGrant) -> bool:
    """Whether `grant`'s key is limited to chosen endpoints (call `load_key` first)."""
    return _restrictions.get(grant.key_id) is not None


def limits_of(grant: KeyGrant, endpoint_requests: int | None, endpoint_tokens: int | None) -> Limits:
    """The limits of `grant`'s requests to an endpoint with these defaults."""
    return Limits(grant.requests_per_min, grant.tokens_per_min, endpoint_requests, endpoint_tokens)


def mark_scope(scope: dict[str, Any], grant: KeyGrant) -> None:
    """Name the key in the request's scope, so what the request uses is metered per key."""
    scope[API_KEY_ID_SCOPE_KEY] = grant.key_id


def client_ip(scope: dict[str, Any]) -> str | None:
    """The address the request came from (`kernel.client_address`: the peer, or what a trusted proxy forwarded)."""
    return scope_client_ip(scope)

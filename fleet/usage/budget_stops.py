"""Budgets' hard stops, shared by every web process through Redis and read without a round trip per request.

The minute's evaluation (`services.budgets_evaluate`) publishes the whole set of stopped scopes in one
Redis hash (`w<workspace id>` / `k<api key id>` → the JSON reason); each web process keeps a copy for
`BUDGET_STOPS_CACHE_S` (default 5 s) and reloads it with one HGETALL when it is older, so a stop is in force
on every replica within that time of the evaluation. A Redis that cannot be reached keeps the last copy
(fail open on a cold start: an outage of this store never stops inference). While requests come, the proxy
reloads the copy before it is that old (`reload`, from `fleet.proxy.warm_caches`): no request waits for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings

logger = logging.getLogger(__name__)

KEY = "cleverthis:budget:stops"


def scope_key(*, workspace_id: Any = None, api_key_id: int | None = None) -> str:
    """The hash field of a workspace's (or an API key's) stop."""
    return f"k{api_key_id}" if api_key_id is not None else f"w{workspace_id}"


def publish(stops: dict[str, dict[str, Any]]) -> None:
    """Replace the set of stopped scopes (one MULTI: readers never see it half written)."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        pipe = client.pipeline(transaction=True)
        pipe.delete(KEY)
        if stops:
            pipe.hset(KEY, mapping={k: json.dumps(v) for k, v in stops.items()})
        pipe.execute()
    finally:
        client.close()


_clients: dict[asyncio.AbstractEventLoop, aioredis.Redis] = {}
_copy: dict[str, dict[str, Any]] = {}
_loaded_at = -1e9


async def _reload() -> None:
    global _copy, _loaded_at
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        for old in [other for other in _clients if other.is_closed()]:
            del _clients[old]
        client = _clients[loop] = aioredis.Redis.from_url(settings.REDIS_URL)
    _loaded_at = time.monotonic()
    try:
        raw = await client.hgetall(KEY)
    except (redis.RedisError, OSError):
        logger.warning("budgets: Redis unreachable, the last known stops kept", exc_info=True)
        return
    _copy = {k.decode(): json.loads(v) for k, v in raw.items()}


async def stopped(workspace_id: Any, api_key_id: int | None) -> dict[str, Any] | None:
    """The reason a request of `workspace_id` (by key `api_key_id`, if any) is refused, or None."""
    if time.monotonic() - _loaded_at >= settings.BUDGET_STOPS_CACHE_S:
        await _reload()
    if api_key_id is not None:
        found = _copy.get(scope_key(api_key_id=api_key_id))
        if found is not None:
            return found
    return _copy.get(scope_key(workspace_id=workspace_id))


def age_s() -> float:
    """How old this process's copy is (seconds)."""
    return time.monotonic() - _loaded_at


async def reload() -> None:
    """Read the stops again now (`fleet.proxy.warm_caches` calls it before the copy goes stale)."""
    await _reload()


def forget() -> None:
    """Drop this process's copy (tests; the next request reloads it)."""
    global _copy, _loaded_at
    _copy, _loaded_at = {}, -1e9

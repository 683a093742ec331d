"""Rate limits of API keys on endpoint invocation, shared by every replica through Redis.

Each limit is a per-minute window (wall-clock minutes) counted in Redis: requests a minute and tokens
a minute, for the key across all endpoints (the key's own limits) and for the key on one endpoint (the
endpoint's defaults for every key). `admit` checks and counts a request in one Lua script (atomic, one
round trip, refused requests are not counted); it refuses while any request count is at its limit or
any token count has reached it. Tokens are known only after the response: `charge_tokens` adds them.
The caller is an API key (its id) or, for a signed-in member's origin cookie or an older DRF token,
the user ("u<id>"): the endpoint's per-key limits apply to each of them alike.

A Redis that cannot be reached lets requests through (fail open: an outage of the limiter's store never
stops inference), logged and counted in `cleverthis_rate_limit_unavailable_total`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio as aioredis
from django.conf import settings

from kernel.metrics import API_KEY_RATE_LIMITED, RATE_LIMIT_UNAVAILABLE

logger = logging.getLogger(__name__)

WINDOW_S = 60
PREFIX = "cleverthis:ratelimit"
# KEYS: request counters, then token counters; ARGV[1]: how many request counters; ARGV[2]: their TTL;
# ARGV[3…]: the limit of each key in order. Returns 0 (admitted, request counters incremented), else the
# 1-based index of the first counter at its limit.
_ADMIT = """
local n = tonumber(ARGV[1])
for i = 1, #KEYS do
  local used = tonumber(redis.call('GET', KEYS[i]) or '0')
  if used >= tonumber(ARGV[2 + i]) then return i end
end
for i = 1, n do
  redis.call('INCR', KEYS[i])
  redis.call('EXPIRE', KEYS[i], tonumber(ARGV[2]))
end
return 0
"""


@dataclass(frozen=True)
class Limits:
    """The limits that apply to one key's request to one endpoint (None: no such limit)."""

    key_requests: int | None = None
    key_tokens: int | None = None
    endpoint_requests: int | None = None
    endpoint_tokens: int | None = None

    def any(self) -> bool:
        values = (self.key_requests, self.key_tokens, self.endpoint_requests, self.endpoint_tokens)
        return any(v is not None for v in values)

    def count_tokens(self) -> bool:
        """Whether a tokens-per-minute limit applies (only then are answers' tokens charged)."""
        return self.key_tokens is not None or self.endpoint_tokens is not None


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused and how long to wait."""

    limit: str  # "requests" or "tokens"
    retry_after: int


def _window(now: float) -> tuple[int, int]:
    """(the current window's number, seconds until it ends, at least 1)."""
    window = int(now // WINDOW_S)
    return window, max(1, math.ceil((window + 1) * WINDOW_S - now))


Caller = int | str  # an API key's id, or "u<user id>"


def _counter(kind: str, key_id: Caller, endpoint_id: Any, window: int) -> str:
    where = f"e{endpoint_id}" if endpoint_id is not None else "all"
    who = f"k{key_id}" if isinstance(key_id, int) else key_id
    return f"{PREFIX}:{kind}:{who}:{where}:{window}"


def _plan(key_id: Caller, endpoint_id: Any, limits: Limits, window: int) -> tuple[list[str], list[int], int]:
    requests = [(None, limits.key_requests), (endpoint_id, limits.endpoint_requests)]
    tokens = [(None, limits.key_tokens), (endpoint_id, limits.endpoint_tokens)]
    keys: list[str] = []
    values: list[int] = []
    for kind, pairs in (("req", requests), ("tok", tokens)):
        for where, limit in pairs:
            if limit is not None:
                keys.append(_counter(kind, key_id, where, window))
                values.append(limit)
    n_requests = sum(1 for _, limit in requests if limit is not None)
    return keys, values, n_requests


_async_clients: dict[asyncio.AbstractEventLoop, tuple[aioredis.Redis, Any]] = {}  # per event loop: client, script
_sync_client: redis.Redis | None = None


def _async_client() -> tuple[aioredis.Redis, Any]:
    """This event loop's client and its admission script (EVALSHA: the script's text is sent once)."""
    loop = asyncio.get_running_loop()
    found = _async_clients.get(loop)
    if found is None:
        for old in [other for other in _async_clients if other.is_closed()]:
            del _async_clients[old]
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        found = _async_clients[loop] = (client, client.register_script(_ADMIT))
    return found


def _admit_script() -> Any:
    return _async_client()[1]


def _client() -> redis.Redis:
    global _sync_client
    if _sync_client is None:
        _sync_client = redis.Redis.from_url(settings.REDIS_URL)
    return _sync_client


_TOKENS_LIMITED_MAX = 10_000
# (key id, endpoint id) pairs this process admitted under a tokens-per-minute limit: the answers of only
# these are charged (`charge_metered`); a limit set later is seen with that pair's next request.
_tokens_limited: set[tuple[Caller, Any]] = set()


async def admit(key_id: Caller, endpoint_id: Any, limits: Limits, *, now: float | None = None) -> Refusal | None:
    """Count one request of the caller `key_id` (a key's id or "u<user id>") to `endpoint_id`, or refuse it
    (None: admitted)."""
    if limits.count_tokens():
        if len(_tokens_limited) >= _TOKENS_LIMITED_MAX:
            _tokens_limited.clear()
        _tokens_limited.add((key_id, endpoint_id))
    if not limits.any():
        return None
    window, left = _window(time.time() if now is None else now)
    keys, values, n_requests = _plan(key_id, endpoint_id, limits, window)
    try:
        over = int(await _admit_script()(keys=keys, args=[n_requests, WINDOW_S + 5, *values]))
    except (redis.RedisError, OSError):
        logger.warning("rate limits: Redis unreachable, request let through", exc_info=True)
        RATE_LIMIT_UNAVAILABLE.labels("admit").inc()
        return None
    if over == 0:
        return None
    kind = "requests" if over <= n_requests else "tokens"
    API_KEY_RATE_LIMITED.labels(kind).inc()
    return Refusal(kind, left)


def charge_tokens(api_key_id: Caller, endpoint_id: Any, n: int, *, now: float | None = None) -> None:
    """Add `n` tokens a response of `endpoint_id` used to key `api_key_id`'s counts of this minute (sync).

    Both counters (the key's and the key's on that endpoint) are charged; admission only reads those with
    a limit, so charging an unlimited pair costs two short-lived keys and nothing else.
    """
    if n <= 0:
        return
    window, _ = _window(time.time() if now is None else now)
    try:
        pipe = _client().pipeline(transaction=False)
        for where in (None, endpoint_id):
            counter = _counter("tok", api_key_id, where, window)
            pipe.incrby(counter, n)
            pipe.expire(counter, WINDOW_S + 5)
        pipe.execute()
    except (redis.RedisError, OSError):
        logger.warning("rate limits: Redis unreachable, %d tokens not charged", n, exc_info=True)
        RATE_LIMIT_UNAVAILABLE.labels("charge").inc()


async def charge_tokens_async(api_key_id: Caller, endpoint_id: Any, n: int) -> None:
    """`charge_tokens` from the event loop: one pipelined round trip on this loop's client."""
    if n <= 0:
        return
    window, _ = _window(time.time())
    try:
        pipe = _async_client()[0].pipeline(transaction=False)
        for where in (None, endpoint_id):
            counter = _counter("tok", api_key_id, where, window)
            pipe.incrby(counter, n)
            pipe.expire(counter, WINDOW_S + 5)
        await pipe.execute()
    except (redis.RedisError, OSError):
        logger.warning("rate limits: Redis unreachable, %d tokens not charged", n, exc_info=True)
        RATE_LIMIT_UNAVAILABLE.labels("charge").inc()


_charging: set[asyncio.Task[None]] = set()  # charges under way (a reference each until it ends)


def _charged(task: asyncio.Task[None]) -> None:
    _charging.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logger.error("rate limits: charging tokens failed", exc_info=task.exception())


def charge_metered(
    workspace_id: Any,
    endpoint_id: Any,
    api_key_id: int | None,
    prompt: int,
    completion: int,
    caller: Caller | None = None,
) -> None:
    """Usage metering's callback (on the event loop, after each metered request): the prompt and completion
    tokens of a request whose caller was rate-limited (a key, or a member by cookie or token) are charged
    to that caller's tokens-per-minute counts, when a tokens-per-minute limit applied to its admission
    (else nothing reads them: no Redis round trip)."""
    who = caller if caller is not None else api_key_id
    if who is None or prompt + completion <= 0 or (who, endpoint_id) not in _tokens_limited:
        return
    task = asyncio.get_running_loop().create_task(charge_tokens_async(who, endpoint_id, prompt + completion))
    _charging.add(task)
    task.add_done_callback(_charged)

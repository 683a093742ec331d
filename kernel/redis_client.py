"""The one Redis client of a process for what it keeps in Redis itself (per-minute rollups, per-replica load,
node metric history), made on first use from `settings.REDIS_URL` with short timeouts: callers treat Redis
as best effort and must not hang on it. (Channels, the cache and Celery bring their own connections.)"""

from __future__ import annotations

import redis
from django.conf import settings

_client: redis.Redis | None = None


def redis_client() -> redis.Redis:
    """This process's client (thread-safe: redis-py pools its connections), made on first use."""
    global _client
    if _client is None:
        _client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    return _client

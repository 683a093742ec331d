"""Failed usage flushes, told to every web process: each process that could not write its metered usage
leaves a note in Redis (one hash field per process, kept FLUSH_FAILURE_SHOWN_S), which the Usage page shows
as a banner until that process writes again (`fleet.usage.meter` calls `note_failure` / `note_recovered`)."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import Any

import redis

from kernel.redis_client import redis_client

log = logging.getLogger(__name__)

FLUSH_FAILURES_KEY = "cleverthis:usage:flush_failures"
FLUSH_FAILURE_SHOWN_S = 3600  # a note older than this is dropped (its process has gone or stopped failing)
_failing = False


def failing() -> bool:
    """Whether this process's last flush failed (and its note has not been cleared)."""
    return _failing


def _process_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def note_failure(exc: BaseException, buckets: int) -> None:
    """Tell every web process that this one's usage is not being written (the Usage page's banner)."""
    global _failing
    _failing = True
    text = str(exc).strip()
    note = {"at": time.time(), "error": text.splitlines()[0][:300] if text else type(exc).__name__, "buckets": buckets}
    try:
        client = redis_client()
        client.hset(FLUSH_FAILURES_KEY, _process_name(), json.dumps(note))
        client.expire(FLUSH_FAILURES_KEY, FLUSH_FAILURE_SHOWN_S)
    except redis.RedisError:
        log.warning("could not record the failed usage flush in Redis")


def note_recovered() -> None:
    """This process wrote its usage again: its note goes (kept, and retried next time, if Redis is down)."""
    global _failing
    try:
        redis_client().hdel(FLUSH_FAILURES_KEY, _process_name())
    except redis.RedisError:
        log.warning("could not clear the failed usage flush in Redis")
        return
    _failing = False


def flush_failures() -> list[dict[str, Any]]:
    """The processes whose last usage flush failed within FLUSH_FAILURE_SHOWN_S, oldest failure first:
    `{"process", "at" (epoch seconds), "error", "buckets"}` each ([] when Redis cannot be read)."""
    try:
        notes = redis_client().hgetall(FLUSH_FAILURES_KEY)
    except redis.RedisError:
        return []
    since = time.time() - FLUSH_FAILURE_SHOWN_S
    found = []
    for process, raw in notes.items():
        try:
            note = json.loads(raw)
        except ValueError:
            continue
        if isinstance(note, dict) and float(note.get("at", 0)) >= since:
            found.append({"process": process.decode(), **note})
    return sorted(found, key=lambda n: n["at"])

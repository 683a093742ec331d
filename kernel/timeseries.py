"""Per-minute rollups for the last hour, kept in Redis: the figures the fleet home page draws.

A series is a name (a workspace's: `workspace_series(pk)`) with any number of measures per minute. Each
(series, minute) is one Redis hash `<KEY_PREFIX><series>:<minute>` whose fields are the measures; it
expires once it leaves the window, so a series never holds more than `SLOTS` hashes, whatever the write
rate. Like the nodes' utilization history it is telemetry that may be lost (a Redis restart empties the
charts, nothing else).

A measure is written three ways: `set` (a sampled gauge: the last sample of the minute wins), `add` (a
counter) and `max`. Writes: one EVAL per batch. Reads: one pipelined round trip for any number of series.
A Redis outage is logged, never raised: a chart is never worth a failed request or task.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis

from kernel.redis_client import redis_client

log = logging.getLogger(__name__)

KEY_PREFIX = "cleverthis:series:"
STEP_S = 60  # one bucket a minute
SLOTS = 60  # the last hour

Op = Literal["set", "add", "max"]

# KEYS: one per write. ARGV: ttl, then per write op (s/a/m), field, value.
_WRITE_LUA = """
local ttl = tonumber(ARGV[1])
for i = 1, #KEYS do
  local key, op, field, value = KEYS[i], ARGV[i * 3 - 1], ARGV[i * 3], ARGV[i * 3 + 1]
  if op == 'a' then
    redis.call('HINCRBYFLOAT', key, field, value)
  elseif op == 'm' then
    local old = tonumber(redis.call('HGET', key, field))
    if not old or tonumber(value) > old then redis.call('HSET', key, field, value) end
  else
    redis.call('HSET', key, field, value)
  end
  redis.call('EXPIRE', key, ttl)
end
return #KEYS
"""
_OPS = {"set": "s", "add": "a", "max": "m"}


def workspace_series(workspace_id: Any) -> str:
    """The series of one workspace (every rollup of its fleet goes in it, one measure name each)."""
    return f"ws:{workspace_id}"


def minute_of(when: float) -> int:
    """The bucket number of an epoch time."""
    return int(when // STEP_S)


def _key(series: str, minute: int) -> str:
    return f"{KEY_PREFIX}{series}:{minute}"


@dataclass(frozen=True)
class Write:
    """One measure of one series: `op` `value` into the bucket of `at` (epoch s; None = now)."""

    series: str
    measure: str
    value: float
    op: Op = "set"
    at: float | None = None


def record(writes: Sequence[Write], *, now: float | None = None) -> None:
    """Apply a batch of writes: one Redis call."""
    if not writes:
        return
    now = now if now is not None else time.time()
    keys: list[str] = []
    args: list[Any] = [STEP_S * (SLOTS + 1)]
    for w in writes:
        keys.append(_key(w.series, minute_of(w.at if w.at is not None else now)))
        args += [_OPS[w.op], w.measure, repr(float(w.value))]
    try:
        redis_client().eval(_WRITE_LUA, len(keys), *keys, *args)
    except redis.RedisError as exc:
        log.warning("fleet rollups not recorded (%d writes): %s", len(writes), exc)


def window(*, now: float | None = None) -> list[int]:
    """The minutes of the window, oldest first (the last is the current minute)."""
    last = minute_of(now if now is not None else time.time())
    return list(range(last - SLOTS + 1, last + 1))


def read(series: Iterable[str], *, now: float | None = None) -> dict[str, list[dict[str, float]]]:
    """Each series over the window: one dict of measures per minute, oldest first ({} = nothing recorded).

    Empty minutes everywhere when Redis cannot be reached.
    """
    names = list(dict.fromkeys(series))
    minutes = window(now=now)
    if not names:
        return {}
    try:
        pipe = redis_client().pipeline(transaction=False)
        for name in names:
            for minute in minutes:
                pipe.hgetall(_key(name, minute))
        raw = pipe.execute()
    except redis.RedisError as exc:
        log.warning("fleet rollups not read: %s", exc)
        raw = [{} for _ in range(len(names) * len(minutes))]
    out: dict[str, list[dict[str, float]]] = {}
    for i, name in enumerate(names):
        buckets = raw[i * len(minutes) : (i + 1) * len(minutes)]
        out[name] = [{k.decode(): float(v) for k, v in bucket.items()} for bucket in buckets]
    return out

"""A compact utilization history per node: CPU, memory, GPU utilization and VRAM, in percent.

Kept in Redis, not PostgreSQL: it is telemetry that may be lost (a Redis restart empties the charts,
nothing else), it changes on every heartbeat, and rewriting a row per heartbeat would add an UPDATE and
a dead tuple per beat to the node table's vacuum work. Each node has one fixed-size ring per resolution:
a Redis hash whose fields are slot numbers (bucket number modulo the ring's size), so a node never holds
more than `slots` entries per resolution (60 one-minute buckets for the last hour, 96 fifteen-minute
buckets for the last day: at most 156 small fields), whatever its heartbeat rate. A bucket holds the
running mean of the beats that fell into it (downsampled on write). Keys expire one ring length after
the last beat, so a deleted or silent node's history goes away by itself.

Writes: one EVAL per batch of heartbeats (the batch the tunnel consumer already coalesces into one
UPDATE), so at most one write per heartbeat. Reads: one pipelined round trip for any number of nodes.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from kernel.redis_client import redis_client

log = logging.getLogger(__name__)

KEY_PREFIX = "cleverthis:metrics:"
SERIES = ("cpu", "memory", "gpu", "vram")
SERIES_LABELS = {"cpu": "CPU", "memory": "Memory", "gpu": "GPU utilization", "vram": "VRAM"}


@dataclass(frozen=True)
class Resolution:
    """One ring: `slots` buckets of `step_s` seconds each."""

    name: str
    step_s: int
    slots: int
    label: str


HOUR = Resolution("hour", 60, 60, "last hour")
DAY = Resolution("day", 900, 96, "last day")
RESOLUTIONS = (HOUR, DAY)

# KEYS: two per node (hour ring, day ring). ARGV: now, then per node cpu, memory, gpu, vram ("" = none).
# A bucket is "bucket|count|cpu|memory|gpu|vram"; a new beat in the same bucket updates the running mean.
_RECORD_LUA = """
local now = tonumber(ARGV[1])
local rings = {{HOUR_STEP, HOUR_SLOTS}, {DAY_STEP, DAY_SLOTS}}
local nodes = #KEYS / 2
for i = 0, nodes - 1 do
  local beat = {ARGV[2 + i * 4], ARGV[3 + i * 4], ARGV[4 + i * 4], ARGV[5 + i * 4]}
  for r = 1, 2 do
    local key = KEYS[i * 2 + r]
    local step, slots = rings[r][1], rings[r][2]
    local bucket = math.floor(now / step)
    local slot = bucket % slots
    local old = redis.call('HGET', key, slot)
    local out = {bucket, 1, beat[1], beat[2], beat[3], beat[4]}
    if old then
      local f = {}
      for part in string.gmatch(old .. '|', '([^|]*)|') do f[#f + 1] = part end
      if tonumber(f[1]) == bucket then
        local n = tonumber(f[2])
        out[2] = n + 1
        for k = 1, 4 do
          local a, b = tonumber(f[k + 2]), tonumber(beat[k])
          if a and b then out[k + 2] = string.format('%.2f', (a * n + b) / (n + 1))
          elseif a then out[k + 2] = f[k + 2] end
        end
      end
    end
    redis.call('HSET', key, slot, table.concat(out, '|'))
    redis.call('EXPIRE', key, step * slots)
  end
end
return nodes
"""
_RINGS = {"HOUR_STEP": HOUR.step_s, "HOUR_SLOTS": HOUR.slots, "DAY_STEP": DAY.step_s, "DAY_SLOTS": DAY.slots}
for _token, _value in _RINGS.items():
    _RECORD_LUA = _RECORD_LUA.replace(_token, str(_value))


def _key(node_id: Any, resolution: Resolution) -> str:
    return f"{KEY_PREFIX}{node_id}:{resolution.name}"


@dataclass(frozen=True)
class Sample:
    """One heartbeat's utilization in percent; GPU fields are None for a node without GPUs."""

    node_id: uuid.UUID | str
    cpu: float
    memory: float
    gpu: float | None = None
    vram: float | None = None


def _num(value: float | None) -> str:
    return "" if value is None else f"{min(max(float(value), 0.0), 100.0):.2f}"


def record(samples: Sequence[Sample], *, now: float | None = None) -> None:
    """Add a batch of heartbeats to their nodes' rings: one Redis call. A Redis outage is logged, never raised."""
    if not samples:
        return
    keys: list[str] = []
    args: list[str] = [str(now if now is not None else time.time())]
    for s in samples:
        keys += [_key(s.node_id, HOUR), _key(s.node_id, DAY)]
        args += [_num(s.cpu), _num(s.memory), _num(s.gpu), _num(s.vram)]
    try:
        redis_client().eval(_RECORD_LUA, len(keys), *keys, *args)
    except redis.RedisError as exc:  # charts are best effort: a heartbeat must never fail for them
        log.warning("metrics history not recorded for %d node(s): %s", len(samples), exc)


def _points(raw: dict[bytes, bytes], resolution: Resolution, now: float) -> dict[str, list[float | None]]:
    """The ring as series oldest → newest, one value (or None for no beat) per bucket of the window."""
    last = int(now // resolution.step_s)
    first = last - resolution.slots + 1
    by_bucket: dict[int, list[str]] = {}
    for value in raw.values():
        parts = value.decode().split("|")
        if len(parts) == 6 and parts[0].lstrip("-").isdigit() and first <= int(parts[0]) <= last:
            by_bucket[int(parts[0])] = parts[2:]
    series: dict[str, list[float | None]] = {name: [] for name in SERIES}
    for bucket in range(first, last + 1):
        values = by_bucket.get(bucket)
        for i, name in enumerate(SERIES):
            text = values[i] if values else ""
            series[name].append(float(text) if text else None)
    return series


def history(
    node_ids: Iterable[Any], resolution: Resolution = HOUR, *, now: float | None = None
) -> dict[str, dict[str, list[float | None]]]:
    """Each node's series for the window (by node id as text); empty series when Redis cannot be reached."""
    ids = [str(n) for n in node_ids]
    now = now if now is not None else time.time()
    if not ids:
        return {}
    try:
        pipe = redis_client().pipeline(transaction=False)
        for node_id in ids:
            pipe.hgetall(_key(node_id, resolution))
        rings = pipe.execute()
    except redis.RedisError as exc:
        log.warning("metrics history not read: %s", exc)
        rings = [{} for _ in ids]
    return {node_id: _points(raw, resolution, now) for node_id, raw in zip(ids, rings, strict=True)}


def forget(node_id: Any) -> None:
    """Drop a node's history (the node was deleted)."""
    try:
        redis_client().delete(*(_key(node_id, r) for r in RESOLUTIONS))
    except redis.RedisError as exc:
        log.warning("metrics history of node %s not removed: %s", node_id, exc)

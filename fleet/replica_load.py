"""Requests in flight and tokens per second per endpoint replica, shared by every web process through Redis.

Each web process knows only its own load: the requests it has in flight to each replica (`balancer`'s
counts) and the completion tokens each replica served it (`count_tokens`, called by the usage meter when a
request ends; cumulative, in memory). Counting costs a dict update per request, nothing more.

`PUBLISHER` (one per process, started by the proxy with its first request to a replica) writes a snapshot
of those figures every REPLICA_LOAD_PUBLISH_S: one Redis hash per process (`replica-load:p:<process>`,
field = replica key, value = "in_flight tokens_total tokens_per_s routed affinity_hits") that expires
REPLICA_LOAD_TTL_S after the write, so a process that crashed or hangs takes its figures with it within the
TTL: nothing can stay counted in flight for a process that is gone (the leak SkyServe had, skypilot#10444).
A set of process names (`replica-load:procs`, a sorted set scored by the publish time) lets readers find the
hashes without scanning the keyspace; a reader prunes names not refreshed for a minute (their hashes expired long ago).

The same hash holds each endpoint's wait queue in this process (`fleet.admission`), one field per endpoint
(`q:<endpoint id>` = "waiting refused w0 w1 ...": requests waiting now, and of the last window the requests
refused and the bucket counts of the admitted requests' waits, `fleet.histograms`), and each replica's field
carries the bucket counts of its routing decision times after its five figures. Readers add the buckets
(`read_all`: replicas and queues in one round trip). While a request waits anywhere the loop runs every
ENDPOINT_QUEUE_REFRESH_S instead, and at once when one starts waiting here, so slots freed in one process are
seen by the queues of the others within that time (`admission.set_shared` then hands them out).

Tokens per second: each process computes its own rate over a sliding window (REPLICA_LOAD_WINDOW_S) from
its cumulative count, sampled at each publish on its monotonic clock: (count now - count at the oldest
sample kept) ÷ (time between them). Readers sum the rates of the live snapshots; no cross-machine clock is
involved. Tokens are counted when a request ends (the usage meter reads them from the answer then), so a
long stream shows up in the window in which it finished.

`read()` sums the live snapshots: {replica key: ReplicaLoad}. The same loop keeps the balancer's copy of
what the other processes have in flight (`balancer.set_shared`) fresh: after each publish it reads the sum
(one pipelined round trip a second per process, off the request path); when Redis cannot be read the copy
is dropped and the balancer goes by this process's own counts alone. A process drops a replica from its
snapshot once it has nothing in flight there and served it nothing for a whole window; with nothing left it
deletes its hash, and publishes nothing more until it has load again.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

import redis
from django.conf import settings

from fleet import admission, balancer, histograms
from kernel.redis_client import redis_client

log = logging.getLogger(__name__)

PROCS_KEY = "replica-load:procs"
PROC_PREFIX = "replica-load:p:"
QUEUE_PREFIX = "q:"  # a field of a process's hash holding an endpoint's queue figures, not a replica's
PROCS_PRUNE_S = 60.0  # a name not refreshed for this long is dropped from the set (its hash expired long ago)

_tokens: dict[str, int] = {}  # replica key → completion tokens it served this process (cumulative)


@dataclass(frozen=True)
class ReplicaLoad:
    """A replica's load summed over the live web processes."""

    in_flight: int = 0
    tokens_per_s: float = 0.0
    tokens_total: int = 0  # served through the processes alive now, since each started
    routed: int = 0  # requests the processes alive now sent to it (`balancer`'s counts)
    affinity_hits: int = 0  # of those, requests whose affinity key went to this replica the time before

    decisions: tuple[int, ...] = ()  # routing decision times (µs) in the last window, by `histograms` bucket

    @property
    def affinity_hit_rate(self) -> float | None:
        """Affinity hits per request routed (None before any)."""
        return self.affinity_hits / self.routed if self.routed else None

    @property
    def decision_p50_us(self) -> float | None:
        return histograms.quantile(self.decisions, histograms.DECISION_BOUNDS_US, 0.5)

    @property
    def decision_p99_us(self) -> float | None:
        return histograms.quantile(self.decisions, histograms.DECISION_BOUNDS_US, 0.99)


@dataclass(frozen=True)
class QueueLoad:
    """An endpoint's wait queue summed over the live web processes: requests waiting now, and of the last
    window (REPLICA_LOAD_WINDOW_S) the waits of the requests admitted (0 for those admitted at once, by
    `histograms.WAIT_BOUNDS_S` bucket) and the requests refused (429)."""

    waiting: int = 0
    waits: tuple[int, ...] = ()
    refused: int = 0

    @property
    def admitted(self) -> int:
        return sum(self.waits)

    @property
    def wait_p50_s(self) -> float | None:
        return histograms.quantile(self.waits, histograms.WAIT_BOUNDS_S, 0.5)

    @property
    def wait_p99_s(self) -> float | None:
        return histograms.quantile(self.waits, histograms.WAIT_BOUNDS_S, 0.99)


def count_tokens(key: str, tokens: int) -> None:
    """Note `tokens` completion tokens served by replica `key` in this process."""
    if key and tokens > 0:
        _tokens[key] = _tokens.get(key, 0) + tokens


def process_name() -> str:
    """A name for this process unique among all machines (host, pid and a random part: pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LoadPublisher:
    """This process's snapshot of its per-replica figures, written to Redis about every second.

    `sample` builds the snapshot (and keeps the window of token counts); `publish` writes it; `run` does
    both forever on the event loop (the write on a thread), logging a failed pass and trying again at the
    next; `ensure_running` starts it (again, if it ever ended) on the running loop.
    """

    def __init__(self, name: str | None = None) -> None:
        self._name, self._pid = name, os.getpid()
        self.window: collections.deque[tuple[float, dict[str, int], dict[str, int]]] = collections.deque()
        self.published = False  # the hash holds figures (so an empty snapshot must delete it)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._hurry: asyncio.Event | None = None  # set when a request starts waiting: refresh now

    @property
    def name(self) -> str:
        """This process's name (made on first use, and again in a child forked after it was made)."""
        if self._name is None or self._pid != os.getpid():
            self._name, self._pid = process_name(), os.getpid()
        return self._name

    @property
    def key(self) -> str:
        return PROC_PREFIX + self.name

    def sample(self, now: float | None = None) -> dict[str, tuple]:
        """{replica key: (in flight, tokens served, tokens/s over the window, routed, affinity hits, decision
        time bucket counts over the window)} of this process now."""
        now = time.monotonic() if now is None else now
        totals = dict(_tokens)
        routed = balancer.routed()
        self.window.append((now, totals, {k: r[0] for k, r in routed.items()}))
        while len(self.window) > 1 and now - self.window[1][0] >= settings.REPLICA_LOAD_WINDOW_S:
            self.window.popleft()  # keep the newest sample at least a window old as the base
        base_at, base, base_routed = self.window[0]
        span = now - base_at
        in_flight = balancer.in_flight()
        snapshot: dict[str, tuple] = {}
        for key in set(totals) | set(in_flight) | set(routed):
            served = totals.get(key, 0)
            sent, hits = routed.get(key, (0, 0))
            rate = max(served - base.get(key, 0), 0) / span if span > 0 else 0.0
            idle_for_window = (
                span >= settings.REPLICA_LOAD_WINDOW_S
                and served == base.get(key, 0)
                and sent == base_routed.get(key, 0)
            )
            if not in_flight.get(key) and idle_for_window:
                _tokens.pop(key, None)  # nothing here for a whole window: forget it (no growth per replica)
                balancer.forget_routed(key)
                for _, old, old_routed in self.window:
                    old.pop(key, None)
                    old_routed.pop(key, None)
                continue
            decided = tuple(balancer.decisions(key, settings.REPLICA_LOAD_WINDOW_S))
            figures = (in_flight.get(key, 0), served, rate, sent, hits)
            snapshot[key] = (*figures, decided) if any(decided) else figures
        return snapshot

    def sample_queues(self, now: float | None = None) -> dict[str, tuple[int, tuple[int, ...], int]]:
        """{endpoint id: (requests waiting, wait bucket counts over the window, refused over the window)} of
        this process now (endpoints with none of these left out)."""
        window = settings.REPLICA_LOAD_WINDOW_S
        found = {}
        for name, gate in admission.gates().items():
            waits = gate.waits.counts(window, now)
            refused = sum(gate.refusals.counts(window, now))
            if gate.queued or any(waits) or refused:
                found[name] = (gate.queued, tuple(waits), refused)
        return found

    def publish(
        self,
        snapshot: Mapping[str, tuple],
        *,
        wall: float | None = None,
        queues: Mapping[str, tuple[int, tuple[int, ...], int]] | None = None,
    ) -> None:
        """Write `snapshot` (and the endpoints' `queues`) as this process's hash (replacing the last one),
        expiring after the TTL."""
        if not snapshot and not queues and not self.published:
            return
        pipe = redis_client().pipeline(transaction=True)
        pipe.delete(self.key)
        if snapshot or queues:
            fields = {k: _field(*figures) for k, figures in snapshot.items()}
            for name, (waiting, waits, refused) in (queues or {}).items():
                fields[QUEUE_PREFIX + name] = " ".join(str(n) for n in (waiting, refused, *waits))
            pipe.hset(self.key, mapping=fields)
            pipe.pexpire(self.key, int(settings.REPLICA_LOAD_TTL_S * 1000))
            pipe.zadd(PROCS_KEY, {self.name: time.time() if wall is None else wall})
            pipe.expire(PROCS_KEY, int(PROCS_PRUNE_S * 10))
        else:
            pipe.zrem(PROCS_KEY, self.name)
        pipe.execute()
        self.published = bool(snapshot or queues)

    def ensure_running(self) -> None:
        """Start the publishing loop on the running event loop unless it runs there already."""
        loop = asyncio.get_running_loop()
        if self._loop is loop and self._task is not None and not self._task.done():
            return
        if self._loop is loop and self._task is not None:  # it ended (`_say_if_ended` said why)
            log.warning("replica load publisher not running; starting it again")
        self._loop = loop
        self._hurry = asyncio.Event()
        admission.on_queued = self._wake
        self._task = loop.create_task(self.run(), name="replica-load-publisher")
        self._task.add_done_callback(_say_if_ended)

    def _wake(self) -> None:
        """Run the next pass now (a request started waiting), if the loop runs on this event loop."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._hurry is not None and running is self._loop:
            self._hurry.set()

    async def run(self) -> None:
        """Publish forever, one pass every REPLICA_LOAD_PUBLISH_S (every ENDPOINT_QUEUE_REFRESH_S while a
        request waits here or elsewhere, and at once when one starts waiting here), then refresh the balancer's
        and the queues' copies of the shared figures and hand out the slots they show free; a failed pass is
        logged, the next one runs."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                snapshot, queues = self.sample(), self.sample_queues()
                await loop.run_in_executor(None, functools.partial(self.publish, snapshot, queues=queues))
                shared, shared_queues = await loop.run_in_executor(None, read_all)
                balancer.set_shared({k: v.in_flight for k, v in shared.items()}, {k: v[0] for k, v in snapshot.items()})
                admission.set_shared(
                    {k: q.waiting for k, q in shared_queues.items()}, {k: q[0] for k, q in queues.items()}
                )
            except Exception:  # Redis away: the figures expire meanwhile, the next pass writes them again
                balancer.set_shared({}, {})  # (decide on this process's own counts rather than stale ones)
                admission.set_shared({}, {})
                log.exception("publishing replica load failed; next try in %ss", settings.REPLICA_LOAD_PUBLISH_S)
            pause = settings.REPLICA_LOAD_PUBLISH_S
            if admission.anyone_waiting():
                pause = min(pause, settings.ENDPOINT_QUEUE_REFRESH_S)
            if self._hurry is not None:
                self._hurry.clear()
                try:
                    await asyncio.wait_for(self._hurry.wait(), timeout=pause)
                except TimeoutError:
                    pass
            else:
                await asyncio.sleep(pause)


def _field(n: int, total: int, rate: float, sent: int = 0, hits: int = 0, decided: tuple[int, ...] = ()) -> str:
    return " ".join([f"{n} {total} {rate:.3f} {sent} {hits}", *(str(d) for d in decided)])


def _say_if_ended(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("replica load publisher ended", exc_info=task.exception())


PUBLISHER = LoadPublisher()


def read() -> dict[str, ReplicaLoad]:
    """Every replica's load summed over the live snapshots of all web processes (raises redis.RedisError)."""
    return read_all()[0]


def read_queues() -> dict[str, QueueLoad]:
    """Every endpoint's wait queue (by endpoint id) summed over the live web processes (raises RedisError)."""
    return read_all()[1]


def _queue_sum(sums: dict[str, list[int]], name: str, raw: bytes) -> None:
    try:
        figures = [int(p) for p in raw.decode().split()]
    except ValueError:
        return
    if len(figures) >= 2:
        acc = sums.setdefault(name, [0, 0])
        acc[0] += figures[0]
        acc[1] += figures[1]
        waits = histograms.add(acc[2:], figures[2:])
        sums[name] = acc[:2] + waits


def read_all() -> tuple[dict[str, ReplicaLoad], dict[str, QueueLoad]]:
    """Every replica's load and every endpoint's queue summed over the live snapshots of all web processes,
    in one round trip (raises redis.RedisError)."""
    client = redis_client()
    names = [n.decode() if isinstance(n, bytes) else n for n in client.zrange(PROCS_KEY, 0, -1)]
    if not names:
        return {}, {}
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(PROC_PREFIX + name)
    pipe.zremrangebyscore(PROCS_KEY, "-inf", time.time() - PROCS_PRUNE_S)
    *snapshots, _ = pipe.execute()
    sums: dict[str, list[float]] = {}
    decided: dict[str, list[int]] = {}
    queues: dict[str, list[int]] = {}
    for snapshot in snapshots:
        for raw_key, raw_value in snapshot.items():
            key = raw_key.decode()
            if key.startswith(QUEUE_PREFIX):
                _queue_sum(queues, key[len(QUEUE_PREFIX) :], raw_value)
                continue
            try:
                parts = raw_value.decode().split()
                figures = (int(parts[0]), int(parts[1]), float(parts[2]), *(int(p) for p in parts[3:5]))
                decisions = [int(p) for p in parts[5:]]
            except (ValueError, IndexError):
                continue  # (not ours: skip rather than fail every reader)
            acc = sums.setdefault(key, [0, 0, 0.0, 0, 0])
            for i, figure in enumerate(figures):
                acc[i] += figure
            histograms.add(decided.setdefault(key, []), decisions)
    replicas = {
        k: ReplicaLoad(
            in_flight=int(a[0]),
            tokens_total=int(a[1]),
            tokens_per_s=a[2],
            routed=int(a[3]),
            affinity_hits=int(a[4]),
            decisions=tuple(decided.get(k, ())),
        )
        for k, a in sums.items()
    }
    return replicas, {k: QueueLoad(waiting=a[0], refused=a[1], waits=tuple(a[2:])) for k, a in queues.items()}


def discard() -> None:
    """Forget this process's token counts, window and published snapshot (tests: nothing of one leaks into
    the next)."""
    _tokens.clear()
    balancer.discard()
    admission.discard()
    PUBLISHER.window.clear()
    if PUBLISHER.published:
        try:
            PUBLISHER.publish({})
        except redis.RedisError:
            log.warning("could not delete this process's replica load snapshot", exc_info=True)

"""Which replica of a service (an endpoint's) a request goes to: the routing policies, decided in memory.

Each replica's count of requests in flight in this process lives in this process's memory: a request takes
a `Lease` on the replica it goes to and gives it back in a `finally` when its response ended, failed, or the
client left mid-stream, so the counts return to zero whatever happened. The other web processes' counts
come from their snapshots in Redis, which `fleet.replica_load` reads in the background about once a second
and hands over with `set_shared`; a replica's load is then the others' figure (up to a second old) plus this
process's live count. No decision waits on the network.

Policies (`POLICIES`):
- `least_load`: the replica with the lowest load; ties go round the tied replicas in turn.
- `session` and `prefix`: the request's affinity key (a session key, or its leading prompt text: worked out
  by the caller) is hashed onto a consistent-hash ring of the replicas (`VNODES` virtual nodes each, so
  adding or removing one of N replicas moves about 1/N of the keys) and goes to the first replica clockwise
  whose load stays within the bound: at most ceil((1 + ε) x mean load, this request counted), ε =
  `epsilon`; a busier one passes it to the next on the ring (consistent hashing with bounded loads), so one
  hot key cannot pile onto one replica. A request without a key is routed as `least_load`.

An endpoint with a concurrency limit (`fleet.admission`) gives its leases a `limit`: a replica with that many
in flight over all web processes is left out of the choice (a retry after a failed connect may pass it: the
request was admitted already), and each lease tells the endpoint's queue when it gives its replica back.

Per replica this process also counts the requests routed there and the affinity hits among them (a request
whose key went to this same replica the last time it was seen here, of the last `AFFINITY_MEMORY` keys):
an estimate of how often a replica's prefix cache could serve the request, and how long each choice took
(a histogram over the last window). `fleet.replica_load` publishes them with the load.
"""

from __future__ import annotations

import bisect
import collections
import hashlib
import itertools
import math
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from uuid import UUID

from fleet import histograms

LEAST_LOAD, SESSION, PREFIX = "least_load", "session", "prefix"
POLICIES = (LEAST_LOAD, SESSION, PREFIX)
VNODES = 100  # virtual nodes per replica on the ring
DEFAULT_EPSILON = 0.25  # a replica may take up to 1.25 x the mean load before its keys pass on
AFFINITY_MEMORY = 65_536  # keys remembered (last replica each) for the affinity-hit estimate
_RING_CACHE_MAX = 1_024


@dataclass(frozen=True)
class Upstream:
    """One running replica a request may go to: its server's port on a node."""

    key: str  # the replica's server id
    node_id: UUID
    port: int


_outstanding: dict[str, int] = {}  # replica key → requests in flight in this process
_others: dict[str, int] = {}  # replica key → requests in flight in the other web processes (background copy)
_routed: dict[str, list[int]] = {}  # replica key → [requests routed, affinity hits] by this process
_last_replica: collections.OrderedDict[int, str] = collections.OrderedDict()  # key hash → replica it last went to
_decisions: dict[str, histograms.Windowed] = {}  # replica key → how long the choices that picked it took (µs)
_turns = itertools.count()


def outstanding(key: str) -> int:
    """Requests in flight to replica `key` in this process."""
    return _outstanding.get(key, 0)


def load(key: str) -> int:
    """Requests in flight to replica `key` in all web processes: the others' last figure plus this one's now."""
    return _others.get(key, 0) + _outstanding.get(key, 0)


def in_flight() -> dict[str, int]:
    """A copy of every replica's requests in flight in this process (replicas with none are left out)."""
    return dict(_outstanding)


def routed() -> dict[str, tuple[int, int]]:
    """{replica key: (requests routed, affinity hits)} by this process since it started (or forgot the key)."""
    return {k: (v[0], v[1]) for k, v in _routed.items()}


def forget_routed(key: str) -> None:
    """Drop replica `key`'s routing counts (it has been idle: no growth per replica that ever existed)."""
    _routed.pop(key, None)
    _decisions.pop(key, None)


def decisions(key: str, window_s: float) -> list[int]:
    """Bucket counts (`histograms.DECISION_BOUNDS_US`) of the decision times of the requests routed to replica
    `key` by this process in the last `window_s` seconds."""
    found = _decisions.get(key)
    return found.counts(window_s) if found is not None else []


def others(key: str) -> int:
    """Requests in flight to replica `key` in the other web processes (their last published figure)."""
    return _others.get(key, 0)


def set_shared(shared: Mapping[str, int], own_published: Mapping[str, int]) -> None:
    """Take the in-flight figures summed over all web processes (`shared`), which count this process's as
    it published them (`own_published`): what the others have in flight is the difference."""
    others = {}
    for key, n in shared.items():
        rest = n - own_published.get(key, 0)
        if rest > 0:
            others[key] = rest
    global _others
    _others = others


def affinity_hash(key: bytes) -> int:
    """A 64-bit hash of an affinity key (the same in every process: not Python's salted `hash`)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


class Ring:
    """A consistent-hash ring of replica keys, `VNODES` points each."""

    def __init__(self, keys: Collection[str], vnodes: int = VNODES) -> None:
        points = sorted((affinity_hash(f"{key}#{i}".encode()), key) for key in keys for i in range(vnodes))
        self.hashes = [h for h, _ in points]
        self.owners = [k for _, k in points]
        self.size = len(set(keys))

    def walk(self, h: int) -> Iterator[str]:
        """Each replica once, in ring order clockwise from hash `h`."""
        n = len(self.owners)
        if not n:
            return
        start = bisect.bisect_left(self.hashes, h)
        seen: set[str] = set()
        for i in range(n):
            owner = self.owners[(start + i) % n]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == self.size:
                    return

    def owner(self, h: int) -> str | None:
        """The replica key `h` falls to when every replica is free."""
        return next(self.walk(h), None)


_rings: dict[tuple[str, ...], Ring] = {}


def ring_of(keys: tuple[str, ...]) -> Ring:
    """The ring of these replica keys (built once per set of replicas, then cached)."""
    ring = _rings.get(keys)
    if ring is None:
        if len(_rings) >= _RING_CACHE_MAX:
            _rings.clear()
        ring = _rings[keys] = Ring(keys)
    return ring


def choose(upstreams: Collection[Upstream], exclude: Collection[str] = ()) -> Upstream | None:
    """The upstream with the lowest load (ties in turn), leaving out `exclude`; None if none."""
    candidates = [u for u in upstreams if u.key not in exclude]
    if not candidates:
        return None
    loads = [load(u.key) for u in candidates]
    fewest = min(loads)
    tied = [u for u, n in zip(candidates, loads, strict=True) if n == fewest]
    return tied[next(_turns) % len(tied)]


def choose_affine(
    upstreams: Collection[Upstream], h: int, exclude: Collection[str] = (), epsilon: float = DEFAULT_EPSILON
) -> Upstream | None:
    """The first upstream clockwise from hash `h` on the ring of all `upstreams` whose load stays within
    ceil((1 + epsilon) x mean load) with this request counted, leaving out `exclude`; None if none."""
    by_key = {u.key: u for u in upstreams if u.key not in exclude}
    if not by_key:
        return None
    total = sum(load(k) for k in by_key)
    bound = math.ceil((1 + epsilon) * (total + 1) / len(by_key))
    for key in ring_of(tuple(u.key for u in upstreams)).walk(h):
        if key in by_key and load(key) + 1 <= bound:
            return by_key[key]
    return choose(by_key.values())  # (cannot happen: some replica is at or below the mean)


def _note_routed(key: str, h: int | None) -> None:
    counts = _routed.setdefault(key, [0, 0])
    counts[0] += 1
    if h is None:
        return
    if _last_replica.get(h) == key:
        counts[1] += 1
    _last_replica[h] = key
    _last_replica.move_to_end(h)
    if len(_last_replica) > AFFINITY_MEMORY:
        _last_replica.popitem(last=False)


def full(upstreams: Collection[Upstream], limit: int | None) -> list[str]:
    """The keys of the upstreams whose load reached `limit` requests in flight (none when no limit)."""
    return [] if limit is None else [u.key for u in upstreams if load(u.key) >= limit]


class Lease:
    """The replica one request holds (counted in flight) while it is proxied; `take` again after a failed
    connect moves it to another. `policy` and `affinity` (the request's key; None: none) pick the replica;
    `limit` (requests in flight per replica over all web processes; None: none) leaves out the full ones, and
    `on_release` is called each time the request gives its replica back (a slot is free: `fleet.admission`)."""

    def __init__(
        self,
        upstreams: Collection[Upstream],
        policy: str = LEAST_LOAD,
        affinity: bytes | None = None,
        epsilon: float = DEFAULT_EPSILON,
        limit: int | None = None,
        on_release: Callable[[], None] | None = None,
    ) -> None:
        self.upstreams = tuple(upstreams)
        self.tried: list[str] = []
        self.current: Upstream | None = None
        self.hash = affinity_hash(affinity) if affinity is not None and policy != LEAST_LOAD else None
        self.epsilon = epsilon
        self.limit = limit
        self.on_release = on_release

    def take(self, *, over_limit: bool = False) -> Upstream | None:
        """Count the request on the replica its policy picks among those not tried yet and not full (unless
        `over_limit`: a retry after a failed connect, already admitted); None when none is left."""
        self.release()
        started = time.perf_counter_ns()
        exclude = self.tried if over_limit else [*self.tried, *full(self.upstreams, self.limit)]
        if self.hash is None:
            chosen = choose(self.upstreams, exclude=exclude)
        else:
            chosen = choose_affine(self.upstreams, self.hash, exclude=exclude, epsilon=self.epsilon)
        if chosen is not None:
            self.tried.append(chosen.key)
            _outstanding[chosen.key] = outstanding(chosen.key) + 1
            self.current = chosen
            _note_routed(chosen.key, self.hash)
            window = _decisions.get(chosen.key)
            if window is None:
                window = _decisions[chosen.key] = histograms.Windowed(histograms.DECISION_BOUNDS_US)
            window.observe((time.perf_counter_ns() - started) / 1000)
        return chosen

    def release(self) -> None:
        """Stop counting the request on its replica (idempotent)."""
        if self.current is None:
            return
        key, self.current = self.current.key, None
        left = outstanding(key) - 1
        if left > 0:
            _outstanding[key] = left
        else:
            _outstanding.pop(key, None)
        if self.on_release is not None:
            self.on_release()


def discard() -> None:
    """Forget the shared figures, routing counts and remembered keys (tests: nothing leaks into the next)."""
    _others.clear()
    _routed.clear()
    _last_replica.clear()
    _decisions.clear()

"""Least-outstanding-requests choice among the replicas of a service (an endpoint's), in this process.

Each replica's count of requests in flight lives in this process's memory: a request takes a `Lease` on
the replica it goes to and gives it back in a `finally` when its response ended, failed, or the client
left mid-stream, so the counts return to zero whatever happened. Several web processes each balance
their own requests (the counts are per process, not shared). Ties go round the tied replicas in turn.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from dataclasses import dataclass
from uuid import UUID


@dataclass(frozen=True)
class Upstream:
    """One running replica a request may go to: its server's port on a node."""

    key: str  # the replica's server id
    node_id: UUID
    port: int


_outstanding: dict[str, int] = {}  # replica key → requests in flight in this process
_turns = itertools.count()


def outstanding(key: str) -> int:
    """Requests in flight to replica `key` in this process."""
    return _outstanding.get(key, 0)


def in_flight() -> dict[str, int]:
    """A copy of every replica's requests in flight in this process (replicas with none are left out)."""
    return dict(_outstanding)


def choose(upstreams: Collection[Upstream], exclude: Collection[str] = ()) -> Upstream | None:
    """The upstream with the fewest requests in flight (ties in turn), leaving out `exclude`; None if none."""
    candidates = [u for u in upstreams if u.key not in exclude]
    if not candidates:
        return None
    fewest = min(outstanding(u.key) for u in candidates)
    tied = [u for u in candidates if outstanding(u.key) == fewest]
    return tied[next(_turns) % len(tied)]


class Lease:
    """The replica one request holds (counted in flight) while it is proxied; `move` after a failed connect."""

    def __init__(self, upstreams: Collection[Upstream]) -> None:
        self.upstreams = tuple(upstreams)
        self.tried: list[str] = []
        self.current: Upstream | None = None

    def take(self) -> Upstream | None:
        """Count the request on the least busy replica not tried yet; None when none is left."""
        self.release()
        chosen = choose(self.upstreams, exclude=self.tried)
        if chosen is not None:
            self.tried.append(chosen.key)
            _outstanding[chosen.key] = outstanding(chosen.key) + 1
            self.current = chosen
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

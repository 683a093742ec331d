"""Fixed-bucket histograms that web processes can add up: each publishes its bucket counts of a recent window,
a reader sums them bucket by bucket and reads quantiles off the sum (a quantile of quantiles would be wrong).

A quantile is reported as the upper bound of the bucket it falls in (an over-estimate by at most one bucket
step; the last bucket, open-ended, reports its lower bound).
"""

from __future__ import annotations

import bisect
import collections
import time
from collections.abc import Sequence

# queue waits, seconds
WAIT_BOUNDS_S = (0.0, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# routing decisions, microseconds
DECISION_BOUNDS_US = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 5_000)


def bucket(bounds: Sequence[float], value: float) -> int:
    """The index of the first bound at or above `value` (len(bounds): above them all)."""
    return bisect.bisect_left(bounds, value)


def quantile(counts: Sequence[int], bounds: Sequence[float], q: float) -> float | None:
    """The `q` quantile of the values counted in `counts` (one more bucket than `bounds`), None if none."""
    total = sum(counts)
    if not total:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        seen += n
        if seen >= rank and n:
            return bounds[min(i, len(bounds) - 1)]
    return bounds[-1]


def add(into: list[int], counts: Sequence[int]) -> list[int]:
    """`into` plus `counts`, bucket by bucket (grown to the longer of the two)."""
    if len(into) < len(counts):
        into.extend([0] * (len(counts) - len(into)))
    for i, n in enumerate(counts):
        into[i] += n
    return into


class Windowed:
    """Counts of the values observed in the last `window_s` seconds: `observe` per value (a bisect and an
    add), `counts` at each publish (the deltas since the previous one kept with their time, the old dropped)."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.fresh = [0] * (len(bounds) + 1)
        self.deltas: collections.deque[tuple[float, list[int]]] = collections.deque()

    def observe(self, value: float) -> None:
        self.fresh[bucket(self.bounds, value)] += 1

    def counts(self, window_s: float, now: float | None = None) -> list[int]:
        """The counts of the last `window_s` seconds (sampled now)."""
        now = time.monotonic() if now is None else now
        if any(self.fresh):
            self.deltas.append((now, self.fresh))
            self.fresh = [0] * (len(self.bounds) + 1)
        while self.deltas and now - self.deltas[0][0] > window_s:
            self.deltas.popleft()
        total = [0] * (len(self.bounds) + 1)
        for _, delta in self.deltas:
            add(total, delta)
        return total

    def empty(self) -> bool:
        return not self.deltas and not any(self.fresh)

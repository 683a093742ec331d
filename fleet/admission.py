"""Held, not refused, at saturation: a concurrency limit per endpoint replica and a bounded wait queue per
endpoint, fair across callers (API keys, members), decided in memory.

A request may go to a replica while that replica's load (its requests in flight over every web process:
`balancer.load`, the others' figure refreshed in the background plus this process's live count) is below
the endpoint's `limit` (its `max_concurrency`, else the `--max-num-seqs` of its server arguments, else
vLLM's default 256: `concurrency_limit`). When every replica is full the request waits in its endpoint's
`Gate` (one per endpoint per process): a future, no polling and no thread, woken when a slot frees
(`dispatch`, called when a request of this process gives its replica back and whenever the shared figures
are refreshed). Waiters are served round-robin over their callers (one request per caller in turn), so a
caller with a thousand queued requests delays another caller's by at most one request each turn.

Past the queue's depth (`depth`: requests waiting over every web process) or its wait bound (`wait_s`) a
request is refused (`Refusal`, the proxy's 429 with Retry-After). With a slot free and nobody waiting the
fast path costs a dict read per replica: no lock, no Redis.

Exact and estimated: within one process the counts are exact (the in-flight leases, the queue). The other
processes' in-flight and queued counts are their last published figures (`fleet.replica_load`: every
REPLICA_LOAD_PUBLISH_S, every ENDPOINT_QUEUE_REFRESH_S while anything waits), so across processes the limit
and the depth are estimates: two processes may fill the same free slot within one refresh (a replica briefly
holds a few requests more than its limit: they wait in the server's own queue, nothing fails). While other
processes have requests waiting for the same endpoint a process keeps to its share of the endpoint's slots
(in proportion to its demand, in flight + waiting, against theirs), so the process whose requests free the
slots does not keep them all: the others see them free at their next refresh.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from django.conf import settings

from fleet import balancer, histograms
from fleet.balancer import Lease, Upstream

DEFAULT_MAX_NUM_SEQS = 256  # vLLM's default --max-num-seqs
# scope key: when a request that waited for a cold start must have its slot (monotonic), so the wait for the
# replica and the wait for a slot share one bound
DEADLINE_SCOPE_KEY = "cleverthis.queue_deadline"
_GATES_MAX = 10_000


def concurrency_limit(server_args: Sequence[str], override: int | None) -> int:
    """Requests in flight per replica: `override` if set, else the server's `--max-num-seqs`, else 256."""
    if override:
        return override
    args = list(server_args or ())
    for i, arg in enumerate(args):
        value = None
        if arg == "--max-num-seqs" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--max-num-seqs="):
            value = arg.partition("=")[2]
        if value is not None and value.strip().isdigit() and int(value) > 0:
            return int(value)
    return DEFAULT_MAX_NUM_SEQS


@dataclass(frozen=True)
class QueuePolicy:
    """An endpoint's admission settings, as its route holds them."""

    endpoint: str  # the endpoint's id (the gate's name in every process)
    limit: int  # requests in flight per replica
    depth: int  # requests waiting, over every web process (0: none wait: refused when full)
    wait_s: float  # how long one may wait
    cold_wait_s: float | None = None  # how long one may wait through a cold start (None: `wait_s`)


@dataclass(frozen=True)
class Refusal:
    """Why a request was not admitted: `queue_full` or `queue_timeout`, and when to retry (seconds)."""

    reason: str
    retry_after: int
    message: str

    def body(self) -> str:
        """The JSON error the client gets (the product's error shape)."""
        error = {"type": self.reason, "message": self.message, "retry_after": self.retry_after}
        return json.dumps({"error": error})

    def headers(self) -> tuple[tuple[bytes, bytes], ...]:
        return ((b"retry-after", str(self.retry_after).encode()),)


@dataclass(eq=False)
class _Waiter:
    lease: Lease
    caller: str
    future: asyncio.Future[Upstream]
    since: float = field(default_factory=time.monotonic)


class Gate:
    """One endpoint's queue in this process, and its figures: what waits now, waits that ended (a window of
    bucket counts), requests refused."""

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        self.upstreams: tuple[Upstream, ...] = ()
        self.callers: collections.OrderedDict[str, collections.deque[_Waiter]] = collections.OrderedDict()
        self.waiting = 0  # in `callers`
        self.cold = 0  # waiting for a cold start (`cold_start`): no replica to queue for yet
        self.others_waiting = 0  # the other processes' (published) count
        self.waits = histograms.Windowed(histograms.WAIT_BOUNDS_S)  # of the requests admitted (0: at once)
        self.refusals = histograms.Windowed(())  # requests refused (one bucket: a count)

    @property
    def queued(self) -> int:
        """Requests of this process waiting for this endpoint (for a slot or for a cold start)."""
        return self.waiting + self.cold

    def has_room(self) -> bool:
        return self.queued + self.others_waiting < self.policy.depth

    def retry_after(self) -> int:
        """Seconds a refused client should wait: the recent median wait, at least 1, at most the wait bound."""
        median = histograms.quantile(self.waits.counts(_window_s()), histograms.WAIT_BOUNDS_S, 0.5) or 0.0
        return max(1, min(math.ceil(self.policy.wait_s) or 1, math.ceil(median)))

    def refuse(self, reason: str, waited_s: float | None = None) -> Refusal:
        """A refusal for `reason` (`waited_s`: the bound the request waited, default the queue's), counted."""
        self.refusals.observe(0)
        after = self.retry_after()
        if reason == "queue_full":
            message = (
                f"Every replica of this endpoint is at its limit of {self.policy.limit} requests and its queue of "
                f"{self.policy.depth} is full; retry in {after} s."
            )
        else:
            message = (
                f"No replica of this endpoint had a free slot within {waited_s or self.policy.wait_s:g} s; "
                f"retry in {after} s."
            )
        return Refusal(reason, after, message)

    def _allowance(self) -> int:
        """How many waiters may take a slot now: the free slots, within this process's share while others wait."""
        limit = self.policy.limit
        free = sum(max(0, limit - balancer.load(u.key)) for u in self.upstreams)
        if not self.others_waiting or not free:
            return free
        mine = sum(balancer.outstanding(u.key) for u in self.upstreams)
        theirs = sum(balancer.others(u.key) for u in self.upstreams) + self.others_waiting
        demand = mine + self.waiting
        share = math.ceil(limit * len(self.upstreams) * demand / max(1, demand + theirs))
        return max(0, min(free, share - mine))

    def dispatch(self) -> None:
        """Hand free slots to the waiters, one caller after another in turn."""
        allowance = self._allowance() if self.waiting else 0
        while allowance > 0 and self.callers:
            caller, queue = next(iter(self.callers.items()))
            waiter = queue[0]
            if waiter.future.done():  # (left: timed out or the client went away)
                self._drop_head(caller, queue)
                continue
            waiter.lease.upstreams = self.upstreams  # (the endpoint's replicas now: a scale-up's new ones too)
            if waiter.lease.take() is None:
                return  # (the free slots are on replicas this waiter's choice cannot use: none, as choices go)
            self._drop_head(caller, queue)  # (a caller with more waiting goes behind the others: their turn next)
            self.waits.observe(time.monotonic() - waiter.since)
            waiter.future.set_result(waiter.lease.current)
            allowance -= 1

    def _drop_head(self, caller: str, queue: collections.deque[_Waiter]) -> None:
        queue.popleft()
        self.waiting -= 1
        self.callers.pop(caller)
        if queue:
            self.callers[caller] = queue

    def _leave(self, waiter: _Waiter) -> None:
        queue = self.callers.get(waiter.caller)
        if queue is not None and waiter in queue:
            queue.remove(waiter)
            self.waiting -= 1
            if not queue:
                del self.callers[waiter.caller]

    async def admit(self, lease: Lease, caller: str, deadline: float | None = None) -> Upstream | Refusal:
        """A replica for the request of `lease` (taken: counted in flight), at once or after waiting its turn;
        a `Refusal` past the depth or the wait bound (`deadline`: monotonic, default now + `wait_s`)."""
        self.upstreams = lease.upstreams
        if not self.waiting and not self.others_waiting:
            chosen = lease.take()
            if chosen is not None:
                self.waits.observe(0.0)
                return chosen
        if not self.has_room():
            return self.refuse("queue_full")
        loop = asyncio.get_running_loop()
        waiter = _Waiter(lease, caller, loop.create_future())
        self.callers.setdefault(caller, collections.deque()).append(waiter)
        self.waiting += 1
        self.dispatch()
        if on_queued is not None and not waiter.future.done():
            on_queued()
        deadline = waiter.since + self.policy.wait_s if deadline is None else deadline
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), timeout=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            pass
        finally:
            if not waiter.future.done():
                waiter.future.cancel()
                self._leave(waiter)
            elif waiter.future.cancelled():
                self._leave(waiter)
        if waiter.future.cancelled():
            return self.refuse("queue_timeout", deadline - waiter.since)
        return waiter.future.result()


_gates: dict[str, Gate] = {}


def gate(policy: QueuePolicy) -> Gate:
    """This process's gate of `policy.endpoint` (made on first use; its settings follow the route's)."""
    found = _gates.get(policy.endpoint)
    if found is None:
        if len(_gates) >= _GATES_MAX:
            for name in [n for n, g in _gates.items() if not g.queued][: _GATES_MAX // 2]:
                del _gates[name]
        found = _gates[policy.endpoint] = Gate(policy)
    found.policy = policy
    return found


def lease_for(
    policy: QueuePolicy,
    upstreams: Collection[Upstream],
    routing: str = balancer.LEAST_LOAD,
    affinity: bytes | None = None,
    epsilon: float = balancer.DEFAULT_EPSILON,
) -> Lease:
    """A lease on the endpoint's replicas that keeps to its limit and wakes its queue when given back."""
    found = gate(policy)
    return Lease(upstreams, routing, affinity, epsilon, limit=policy.limit, on_release=found.dispatch)


def gates() -> dict[str, Gate]:
    """Every endpoint's gate in this process (for publishing)."""
    return _gates


def anyone_waiting() -> bool:
    """Whether a request waits here or in another process (the shared figures then refresh faster)."""
    return any(g.queued or g.others_waiting for g in _gates.values())


def set_shared(waiting: dict[str, int], own_published: dict[str, int]) -> None:
    """Take the requests waiting per endpoint over every web process (`waiting`, counting this process's as it
    published them) and hand out the slots the refreshed figures show free."""
    for name, found in _gates.items():
        found.others_waiting = max(0, waiting.get(name, 0) - own_published.get(name, 0))
    for found in list(_gates.values()):
        if found.waiting:
            found.dispatch()


def _window_s() -> float:
    return settings.REPLICA_LOAD_WINDOW_S


on_queued: Callable[[], None] | None = None  # told when a request starts waiting (the publisher refreshes sooner)


def discard() -> None:
    """Forget every gate (tests)."""
    _gates.clear()

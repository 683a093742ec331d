"""The managed-Ray autoscaler as a pure decision function: no Django, no I/O, no clock.

`decide()` is fed the head's pending resource demand (bundles of pending tasks, actors, placement groups —
Serve replicas and Tune trials are actors and placement groups, so they arrive the same way) and the state
of each worker, and answers how many workers to add and which to remove, with a human reason for each
choice. The Celery beat pass records the reasons as events and carries the decision out (Ray-draining a
worker before its container is stopped).

Rules:
- never fewer than ``min_workers`` live workers (workers below min are added even with no demand);
- never more than ``max_workers`` workers in total: demand beyond that queues in Ray, it does not fail;
- pending bundles are first packed onto free capacity (head first, then the busiest workers); bundles that
  fit nowhere get new workers of ``worker_shape``; a bundle larger than ``worker_shape`` never causes an add;
- a worker is removed only when it has been idle longer than ``idle_timeout_s``, is not needed by pending
  work, and removing it keeps ``min_workers``; the longest-idle go first; nothing is removed while adding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# Resource amounts are floats (Ray allows fractional CPUs/GPUs); compare with a small tolerance.
_EPS = 1e-9

Resources = Mapping[str, float]


@dataclass(frozen=True)
class WorkerState:
    """One Ray worker as the autoscaler sees it.

    ``resources`` is the worker's total capacity and ``available`` what is free on it right now (``None``
    means all of it). ``idle_s`` is how long Ray has seen the node idle (0 while anything runs on it).
    ``draining`` workers are on their way out: they count towards ``max_workers`` but not towards capacity
    or ``min_workers``. ``starting`` workers were launched but have not joined Ray yet: they count as fully
    free capacity and are never removed.
    """

    worker_id: str
    idle_s: float
    resources: Resources
    draining: bool = False
    available: Resources | None = None
    starting: bool = False
    # a rank of a distributed endpoint runs on its fleet node: never removed, however idle Ray sees it
    pinned: bool = False

    def free(self) -> dict[str, float]:
        """Capacity a pending bundle could use on this worker now."""
        return dict(self.resources if self.available is None else self.available)


@dataclass(frozen=True)
class ClusterDemand:
    """What Ray is waiting for: one resource bundle per pending task/actor/placement-group bundle."""

    pending: Sequence[Resources]
    head_free: Resources = field(default_factory=dict)
    worker_shape: Resources = field(default_factory=lambda: {"CPU": 1.0})


@dataclass(frozen=True)
class ScalingPolicy:
    """Bounds and pacing for one Ray cluster; validated on construction."""

    min_workers: int = 0
    max_workers: int = 1
    idle_timeout_s: float = 60.0
    # Demand-driven adds per pass; filling up to min_workers is never limited by it.
    max_step_up: int = 8

    def __post_init__(self) -> None:
        if self.min_workers < 0:
            raise ValueError("min_workers must be >= 0")
        if self.max_workers < self.min_workers:
            raise ValueError("max_workers must be >= min_workers")
        if self.idle_timeout_s <= 0:
            raise ValueError("idle_timeout_s must be > 0")
        if self.max_step_up < 1:
            raise ValueError("max_step_up must be >= 1")


@dataclass(frozen=True)
class Decision:
    """What to do this pass: start `add` workers, drain and stop `remove`, and why (`reasons`)."""

    add: int
    remove: list[str]
    reasons: list[str]
    # Pending bundles left waiting after this decision (at max or step limit), and bundles no worker fits.
    queued: int = 0
    infeasible: list[dict[str, float]] = field(default_factory=list)

    @property
    def changes(self) -> bool:
        """True when the decision starts or stops anything."""
        return self.add > 0 or bool(self.remove)

    def summary(self) -> str:
        """All reasons as one line, for an event message."""
        return "; ".join(self.reasons)


def fits(bundle: Resources, free: Resources) -> bool:
    """True when every amount `bundle` asks for is available in `free`."""
    return all(amount <= free.get(name, 0.0) + _EPS for name, amount in bundle.items() if amount > 0)


def _take(free: dict[str, float], bundle: Resources) -> None:
    for name, amount in bundle.items():
        if amount > 0:
            free[name] = free.get(name, 0.0) - amount


def _size_key(bundle: Resources, shape: Resources) -> tuple[float, float]:
    # Largest first (first-fit decreasing): by the bundle's biggest share of a worker, then its total.
    shares = [amount / shape[name] if shape.get(name) else float("inf") for name, amount in bundle.items() if amount]
    return (max(shares, default=0.0), sum(amount for amount in bundle.values() if amount > 0))


def _fmt(bundle: Resources) -> str:
    return "{" + ", ".join(f"{name}: {amount:g}" for name, amount in sorted(bundle.items()) if amount) + "}"


@dataclass
class _Packing:
    needed_workers: set[str]
    new_workers: int
    infeasible: list[dict[str, float]]
    # Bundles placed on each new worker (in opening order), so we can count what queues when capped.
    per_new_worker: list[int]


def _pack(workers: Sequence[WorkerState], demand: ClusterDemand) -> _Packing:
    """First-fit decreasing of pending bundles onto head, live workers (busiest first), then new workers."""
    live = [w for w in workers if not w.draining]
    # Head first, then workers that are busy or idle the shortest, so the longest-idle stay free to remove.
    slots: list[tuple[str | None, dict[str, float]]] = [(None, dict(demand.head_free))]
    slots += [(w.worker_id, w.free()) for w in sorted(live, key=lambda w: (w.idle_s, w.worker_id))]
    new_slots: list[dict[str, float]] = []
    per_new: list[int] = []
    needed: set[str] = set()
    infeasible: list[dict[str, float]] = []
    for bundle in sorted(demand.pending, key=lambda b: _size_key(b, demand.worker_shape), reverse=True):
        if not any(amount > 0 for amount in bundle.values()):
            continue  # zero-resource tasks never wait for capacity
        for worker_id, free in slots:
            if fits(bundle, free):
                _take(free, bundle)
                if worker_id is not None:
                    needed.add(worker_id)
                break
        else:
            if not fits(bundle, demand.worker_shape):
                infeasible.append(dict(bundle))
                continue
            for index, free in enumerate(new_slots):
                if fits(bundle, free):
                    _take(free, bundle)
                    per_new[index] += 1
                    break
            else:
                free = dict(demand.worker_shape)
                _take(free, bundle)
                new_slots.append(free)
                per_new.append(1)
    return _Packing(needed, len(new_slots), infeasible, per_new)


def decide(policy: ScalingPolicy, workers: Sequence[WorkerState], demand: ClusterDemand) -> Decision:
    """One autoscaling decision for a cluster (pure: same inputs, same answer).

    Idle times come in as durations (``WorkerState.idle_s``), so no clock is needed.
    """
    ids = [w.worker_id for w in workers]
    if len(set(ids)) != len(ids):
        raise ValueError("worker ids must be unique")
    live = [w for w in workers if not w.draining]
    draining = len(workers) - len(live)
    headroom = max(0, policy.max_workers - len(workers))
    packing = _pack(workers, demand)
    reasons: list[str] = []
    if draining:
        reasons.append(f"{draining} worker(s) draining")
    for bundle in packing.infeasible:
        reasons.append(
            f"pending bundle {_fmt(bundle)} is larger than the worker shape {_fmt(demand.worker_shape)}: "
            "no worker can ever run it"
        )

    min_deficit = max(0, policy.min_workers - len(live))
    demand_add = min(packing.new_workers, policy.max_step_up)
    wanted = max(min_deficit, demand_add)
    add = min(wanted, headroom)
    # New workers cover the bundles packed onto them in order; the rest queue in Ray.
    served_new = min(add, packing.new_workers)
    queued = sum(packing.per_new_worker[served_new:])

    if min_deficit:
        reasons.append(f"below min_workers: {len(live)} live < {policy.min_workers}")
    if packing.new_workers:
        pending_new = sum(packing.per_new_worker)
        reasons.append(
            f"{pending_new} pending bundle(s) exceed free capacity: need {packing.new_workers} more worker(s) "
            f"of {_fmt(demand.worker_shape)}"
        )
    if add:
        reasons.append(f"adding {add} worker(s)")
    if queued:
        if add == headroom:
            reasons.append(
                f"pending work queues: at max_workers ({policy.max_workers}); {queued} bundle(s) wait in Ray"
            )
        else:
            reasons.append(f"step limit: at most {policy.max_step_up} worker(s) per pass; {queued} bundle(s) wait")
    if min_deficit > headroom:
        reasons.append(f"cannot reach min_workers now: at max_workers ({policy.max_workers}) counting draining")

    remove: list[str] = []
    if add == 0:
        remove = _removals(policy, live, packing.needed_workers, reasons)
    if not (add or remove):
        reasons.append(_steady_reason(policy, live, pending=bool(demand.pending), queued=queued))
    return Decision(add=add, remove=remove, reasons=reasons, queued=queued, infeasible=packing.infeasible)


def _removals(policy: ScalingPolicy, live: Sequence[WorkerState], needed: set[str], reasons: list[str]) -> list[str]:
    """Idle, unneeded workers to remove, longest idle first, never going below min_workers."""
    over_max = max(0, len(live) - policy.max_workers)
    for worker in live:
        if worker.pinned and worker.idle_s > policy.idle_timeout_s:
            reasons.append(f"keeping idle worker {worker.worker_id}: a distributed endpoint's rank runs on it")
    candidates = sorted(
        (w for w in live if not w.starting and not w.pinned and w.worker_id not in needed and w.idle_s > 0),
        key=lambda w: (-w.idle_s, w.worker_id),
    )
    removable = max(0, len(live) - policy.min_workers)
    remove: list[str] = []
    for worker in candidates:
        if len(remove) >= removable:
            if worker.idle_s > policy.idle_timeout_s:
                reasons.append(
                    f"keeping idle worker {worker.worker_id} (idle {worker.idle_s:.0f}s): "
                    f"min_workers is {policy.min_workers}"
                )
            continue
        if worker.idle_s > policy.idle_timeout_s:
            remove.append(worker.worker_id)
            reasons.append(
                f"removing worker {worker.worker_id}: idle {worker.idle_s:.0f}s > {policy.idle_timeout_s:g}s "
                "and not needed by pending work"
            )
        elif len(remove) < over_max:
            remove.append(worker.worker_id)
            reasons.append(
                f"removing idle worker {worker.worker_id}: {len(live)} live workers exceed "
                f"max_workers ({policy.max_workers})"
            )
    return remove


def _steady_reason(policy: ScalingPolicy, live: Sequence[WorkerState], *, pending: bool, queued: int) -> str:
    if queued:
        work = f"{queued} pending bundle(s) queued"
    elif pending:
        work = "pending work fits free capacity"
    else:
        work = "no pending demand"
    return f"no change: {len(live)} live worker(s) (min {policy.min_workers}, max {policy.max_workers}), {work}"

"""The Ray job queue's rules: pure functions (no queries, no clock) over the queued jobs of one Ray cluster.

Training jobs and Tune experiments not yet submitted to Ray wait in one queue per Ray cluster:

- order: higher `priority` first; within a priority, workspaces take turns (each workspace's first job,
  then each one's second, ...: fair across workspaces sharing a cluster); within a workspace, FIFO;
- a job starts when its CPUs and GPUs fit in what the cluster has free (its live Ray nodes' resources less
  what the submitted, unfinished jobs ask for), or when nothing of the queue runs on the cluster at all
  (so Ray sees the demand and its autoscaler can grow the cluster for a job larger than it is now);
- the first job that does not fit stops the pass: no job of lower rank is started past it (no backfill,
  which would let small low-priority jobs starve a large high-priority one);
- a job that needs more GPUs than the cluster can ever have does not block the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

EPSILON = 1e-9


@dataclass(frozen=True)
class Entry:
    """One queued job as the queue sees it."""

    key: Any
    workspace_id: Any
    priority: int
    created_at: Any
    cpus: float
    gpus: float


@dataclass(frozen=True)
class Free:
    """What a cluster has free now, and whether any queued job of it runs (submitted, unfinished)."""

    cpus: float
    gpus: float
    busy: bool


def order(entries: Iterable[Entry]) -> list[Entry]:
    """`entries` in queue order: priority (high first), then the workspaces' turns, then FIFO."""
    by_ws_priority: dict[tuple[Any, int], list[Entry]] = {}
    for entry in sorted(entries, key=lambda e: (e.created_at, str(e.key))):
        by_ws_priority.setdefault((entry.workspace_id, entry.priority), []).append(entry)
    ranked = []
    for (_, priority), rows in by_ws_priority.items():
        for turn, entry in enumerate(rows):
            ranked.append(((-priority, turn, entry.created_at, str(entry.key)), entry))
    return [entry for _, entry in sorted(ranked, key=lambda pair: pair[0])]


def fits(entry: Entry, free: Free) -> bool:
    """Whether `entry` may start now on a cluster with `free` (see the module's rules)."""
    if not free.busy:
        return True
    return entry.cpus <= free.cpus + EPSILON and entry.gpus <= free.gpus + EPSILON


def take(entry: Entry, free: Free) -> Free:
    """What stays free once `entry` started."""
    return Free(cpus=free.cpus - entry.cpus, gpus=free.gpus - entry.gpus, busy=True)


def plan(entries: Sequence[Entry], free: Free) -> tuple[list[Entry], list[Entry]]:
    """(the jobs to start now, in order; the jobs left waiting, in queue order) for `entries` already in
    queue order. Stops at the first job that does not fit."""
    start: list[Entry] = []
    for index, entry in enumerate(entries):
        if not fits(entry, free):
            return start, list(entries[index:])
        start.append(entry)
        free = take(entry, free)
    return start, []

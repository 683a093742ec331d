"""Workspace quotas: what each quota measures, the usage providers the apps above register, and `admit`.

Tenancy imports nothing above it: `fleet` and `raymgr` register at start (`register_usage`) a function that
sums, for some workspaces, what their rows request (containers, endpoints, Ray clusters and Ray nodes).

`admit(workspace_id=..., ask={...})` runs inside the caller's transaction, before the caller writes the
rows it admits: it locks the workspace's `WorkspaceQuota` row (SELECT ... FOR UPDATE; the row is made
race-free with INSERT ... ON CONFLICT DO NOTHING when missing), so the admissions of one workspace take
turns; the next one sees what the previous committed. For each quota with a limit and a positive ask it
sums current usage through the providers and raises `QuotaExceeded` when usage + ask would pass the
limit. Unlimited quotas cost nothing beyond the lock. Lowering a limit below use stops nothing: it only
refuses new work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cleverthis.tenancy.models import WorkspaceQuota
from kernel.exceptions import QuotaExceeded


@dataclass(frozen=True)
class Quota:
    """One quota: its field on `WorkspaceQuota`, its label, its unit, and whether it counts whole things."""

    name: str
    label: str
    unit: str = ""
    whole: bool = True


QUOTAS: tuple[Quota, ...] = (
    Quota("gpus", "GPUs"),
    Quota("vram_gib", "VRAM", "GiB", whole=False),
    Quota("cpu_cores", "CPU cores", whole=False),
    Quota("memory_gib", "Memory", "GiB", whole=False),
    Quota("containers", "Containers"),
    Quota("endpoints", "Endpoints"),
    Quota("ray_clusters", "Ray clusters"),
    Quota("ray_workers", "Ray workers"),
)
BY_NAME: dict[str, Quota] = {q.name: q for q in QUOTAS}
NAMES: frozenset[str] = frozenset(BY_NAME)
EPSILON = 1e-9  # float sums (fractional cores, GiB) must not refuse an exact fit

# A provider: (workspace ids, quota names wanted) → {workspace id: {quota name: amount in use}}.
UsageProvider = Callable[[Sequence[Any], frozenset[str]], Mapping[Any, Mapping[str, float]]]
_PROVIDERS: dict[str, UsageProvider] = {}


def register_usage(name: str, provider: UsageProvider) -> None:
    """Register (or replace) the usage provider `name`; the apps above tenancy call it from `ready()`."""
    _PROVIDERS[name] = provider


def usage(workspace_ids: Sequence[Any], names: Iterable[str] = NAMES) -> dict[Any, dict[str, float]]:
    """What each workspace has in use against each quota in `names` (0 when nothing), summed over providers.

    A constant number of queries whatever the number of workspaces."""
    wanted = frozenset(names)
    totals: dict[Any, dict[str, float]] = {ws: dict.fromkeys(wanted, 0) for ws in workspace_ids}
    if not workspace_ids or not wanted:
        return totals
    for provider in _PROVIDERS.values():
        for ws, amounts in provider(list(workspace_ids), wanted).items():
            row = totals.setdefault(ws, dict.fromkeys(wanted, 0))
            for name, amount in amounts.items():
                if name in wanted:
                    row[name] += amount or 0
    return totals


def locked_quota(workspace_id: Any) -> WorkspaceQuota:
    """The workspace's quota row, locked until the transaction ends (created first if it is missing)."""
    rows = WorkspaceQuota.objects.select_for_update(of=("self",))
    row = rows.filter(workspace_id=workspace_id).first()
    if row is None:  # a workspace from before quotas or made outside the service: no race, no duplicate
        WorkspaceQuota.objects.bulk_create([WorkspaceQuota(workspace_id=workspace_id)], ignore_conflicts=True)
        row = rows.get(workspace_id=workspace_id)
    return row


def limits_of(row: WorkspaceQuota | None) -> dict[str, float | None]:
    """Each quota's limit (None: unlimited)."""
    return {q.name: getattr(row, q.name) if row is not None else None for q in QUOTAS}


def admit(*, workspace_id: Any, ask: Mapping[str, float]) -> None:
    """Admit `ask` (quota name → amount) in the workspace or raise `QuotaExceeded` for the first quota it
    would pass; call it inside the transaction that then writes what it admitted."""
    unknown = set(ask) - NAMES
    if unknown:
        raise ValueError(f"unknown quotas: {sorted(unknown)}")
    limits = limits_of(locked_quota(workspace_id))
    checked = [name for name, amount in ask.items() if amount > 0 and limits[name] is not None]
    if not checked:
        return
    in_use = usage([workspace_id], checked)[workspace_id]
    for quota in QUOTAS:
        if quota.name not in checked:
            continue
        limit, used, asked = limits[quota.name], in_use[quota.name], ask[quota.name]
        if used + asked > limit + EPSILON:  # type: ignore[operator]
            raise QuotaExceeded(
                quota=quota.name,
                label=quota.label,
                unit=quota.unit,
                limit=_shown(quota, limit),
                in_use=_shown(quota, used),
                asked=_shown(quota, asked),
            )


def _shown(quota: Quota, value: float | None) -> float:
    """A whole number for counts, two decimals for cores and GiB."""
    value = value or 0
    return round(value) if quota.whole else round(float(value), 2)


@dataclass(frozen=True)
class QuotaLine:
    """One quota of one workspace as the home page and the API show it."""

    quota: str
    label: str
    unit: str
    limit: float | None
    in_use: float

    @property
    def percent(self) -> int | None:
        """How full the quota is (None when unlimited; 100 and more when at or over the limit)."""
        if self.limit is None:
            return None
        return 100 if self.limit <= 0 else int(self.in_use * 100 // self.limit)


def quota_report(workspace_ids: Sequence[Any]) -> dict[Any, list[QuotaLine]]:
    """Every quota of each workspace with its limit and usage; a constant number of queries."""
    rows = {r.workspace_id: r for r in WorkspaceQuota.objects.filter(workspace_id__in=list(workspace_ids))}
    used = usage(workspace_ids)
    report: dict[Any, list[QuotaLine]] = {}
    for ws in workspace_ids:
        limits = limits_of(rows.get(ws))
        report[ws] = [
            QuotaLine(
                quota=q.name,
                label=q.label,
                unit=q.unit,
                limit=None if limits[q.name] is None else _shown(q, limits[q.name]),
                in_use=_shown(q, used[ws][q.name]),
            )
            for q in QUOTAS
        ]
    return report

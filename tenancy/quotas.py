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

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import F, FloatField, QuerySet, Value
from django.db.models.functions import Cast

from kernel.exceptions import QuotaExceeded
from tenancy.models import WorkspaceQuota


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
LIMIT_MAX = 1_000_000  # the largest limit the API, the page and the admin take (empty/null: unlimited)
NAMES: frozenset[str] = frozenset(BY_NAME)
EPSILON = 1e-9  # float sums (fractional cores, GiB) must not refuse an exact fit

# A provider: (workspace ids, quota names wanted) → querysets made with `usage_rows` (none when it measures
# none of those quotas). Every provider's rows are read in one query (UNION ALL).
UsageProvider = Callable[[Sequence[Any], frozenset[str]], list[QuerySet]]
_PROVIDERS: dict[str, UsageProvider] = {}


def register_usage(name: str, provider: UsageProvider) -> None:
    """Register (or replace) the usage provider `name`; the apps above tenancy call it from `ready()`."""
    _PROVIDERS[name] = provider
    _STATEMENTS.clear()


def usage_rows(queryset: QuerySet, *, workspace_field: str, **amounts: Any) -> QuerySet:
    """`queryset` grouped by workspace, one column per quota in `QUOTAS` order: the aggregate `amounts`
    gives (e.g. `containers=Count("pk")`), 0 for the others; what providers return."""
    unknown = set(amounts) - NAMES
    if unknown:
        raise ValueError(f"unknown quotas: {sorted(unknown)}")
    columns = {
        f"q_{q.name}": Cast(amounts[q.name], FloatField()) if q.name in amounts else Value(0.0, FloatField())
        for q in QUOTAS
    }
    return queryset.order_by().values(q_ws=F(workspace_field)).annotate(**columns).values_list("q_ws", *columns)


def usage(workspace_ids: Sequence[Any], names: Iterable[str] = NAMES) -> dict[Any, dict[str, float]]:
    """What each workspace has in use against each quota in `names` (0 when nothing), summed over providers.

    One query whatever the number of workspaces and providers (none when no provider measures `names`)."""
    wanted = frozenset(names)
    totals: dict[Any, dict[str, float]] = {ws: dict.fromkeys(wanted, 0) for ws in workspace_ids}
    if not workspace_ids or not wanted:
        return totals
    statement = _usage_statement(wanted, len(workspace_ids))
    if statement is None:
        return totals
    sql, params = statement.bind(workspace_ids)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    given = {str(ws): ws for ws in workspace_ids}  # ids as the caller gave them (UUID or str)
    for ws, *amounts in rows:
        row = totals.setdefault(given.get(str(ws), ws), dict.fromkeys(wanted, 0))
        for quota, amount in zip(QUOTAS, amounts, strict=True):
            if quota.name in wanted:
                row[quota.name] += amount or 0
    return totals


@dataclass(frozen=True)
class _Statement:
    """The providers' UNION ALL compiled once for placeholder workspace ids, bound to real ones per call
    (building and compiling the querysets cost more than running them)."""

    sql: str
    params: tuple[Any, ...]
    placeholders: tuple[uuid.UUID, ...]

    def bind(self, workspace_ids: Sequence[Any]) -> tuple[str, tuple[Any, ...]]:
        ids = [ws if isinstance(ws, uuid.UUID) else uuid.UUID(str(ws)) for ws in workspace_ids]
        real = dict(zip(self.placeholders, ids, strict=True))
        return self.sql, tuple(real.get(p, p) if isinstance(p, uuid.UUID) else p for p in self.params)


_STATEMENTS: dict[tuple[frozenset[str], int], _Statement | None] = {}
_MAX_STATEMENTS = 256


def _usage_statement(wanted: frozenset[str], count: int) -> _Statement | None:
    key = (wanted, count)
    if key not in _STATEMENTS:
        placeholders = tuple(uuid.UUID(int=(1 << 120) + i) for i in range(count))  # never a real uuid4
        parts = [qs for provider in _PROVIDERS.values() for qs in provider(list(placeholders), wanted)]
        statement = None
        if parts:
            combined = parts[0].union(*parts[1:], all=True) if len(parts) > 1 else parts[0]
            sql, params = combined.query.sql_with_params()
            statement = _Statement(sql, tuple(params), placeholders)
        if len(_STATEMENTS) >= _MAX_STATEMENTS:
            _STATEMENTS.clear()
        _STATEMENTS[key] = statement
    return _STATEMENTS[key]


def locked_quota(workspace_id: Any) -> WorkspaceQuota:
    """The workspace's quota row, locked until the transaction ends (created first if it is missing).

    Lock order: a service that locks it does so before any node row (`fleet.services.command_queue` takes
    it first for the commands that are admitted), so admissions and node locks never wait in a circle."""
    row = _lock(workspace_id)
    if row is None:  # a workspace from before quotas or made outside the service: no race, no duplicate
        WorkspaceQuota.objects.bulk_create([WorkspaceQuota(workspace_id=workspace_id)], ignore_conflicts=True)
        row = _lock(workspace_id)
    if row is None:
        raise WorkspaceQuota.DoesNotExist(f"workspace {workspace_id} does not exist")
    return row


def try_lock_quota(workspace_id: Any) -> bool:
    """Lock the workspace's quota row unless another transaction holds it (then False, at once): for
    passes that already hold node rows and must never wait (a drain)."""
    if _lock(workspace_id, skip_locked=True) is not None:
        return True
    if WorkspaceQuota.objects.filter(workspace_id=workspace_id).exists():
        return False  # another transaction holds it
    locked_quota(workspace_id)  # a workspace without its row: made and locked
    return True


_FIELDS = WorkspaceQuota._meta.concrete_fields
_LOCK_SQL = 'SELECT {} FROM "{}" WHERE workspace_id = %s FOR UPDATE'.format(
    ", ".join(f'"{f.column}"' for f in _FIELDS), WorkspaceQuota._meta.db_table
)


def _lock(workspace_id: Any, *, skip_locked: bool = False) -> WorkspaceQuota | None:
    """SELECT ... FOR UPDATE [SKIP LOCKED] of the row, in plain SQL (the ORM's cost would be most of it)."""
    with connection.cursor() as cursor:
        cursor.execute(_LOCK_SQL + (" SKIP LOCKED" if skip_locked else ""), [workspace_id])
        values = cursor.fetchone()
    return None if values is None else WorkspaceQuota.from_db(connection.alias, [f.attname for f in _FIELDS], values)


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

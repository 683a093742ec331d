"""Usage reads, scoped to the user's workspaces: a period's totals, series per bucket, rows per subject."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db.models import Max, Q, QuerySet, Sum

from fleet.models import ComputeCluster
from fleet.usage import costing
from fleet.usage.models import Budget, BudgetLevel, Granularity, PriceVersion, SubjectKind, UsageRollup
from fleet.workloads.models import Endpoint
from fleet.workloads.selectors import key_endpoint_limit
from tenancy.models import ApiKey
from tenancy.selectors import workspace_ids

AnyUser = AbstractBaseUser | AnonymousUser

# The periods a page or API call may ask for: (label, length, bucket granularity)
PERIODS: dict[str, tuple[str, timedelta, str]] = {
    "1h": ("Last hour", timedelta(hours=1), Granularity.MINUTE),
    "24h": ("Last 24 hours", timedelta(hours=24), Granularity.HOUR),
    "7d": ("Last 7 days", timedelta(days=7), Granularity.HOUR),
    "30d": ("Last 30 days", timedelta(days=30), Granularity.HOUR),
}
COUNTERS = (
    "requests",
    "errors",
    "rate_limited",
    "prompt_tokens",
    "completion_tokens",
    "latency_ms_sum",
    "node_seconds",
    "gpu_seconds",
    "container_seconds",
    "cpu_core_seconds",
    "memory_mib_seconds",
)
KEY = ("workspace_id", "subject_kind", "subject_id", "api_key_id")
COSTED = ("bucket_start", *KEY, *COUNTERS, "gpu_seconds", "gpu_seconds_by_model")


@dataclass(frozen=True)
class UsageQuery:
    """What to read: a period, and optionally one workspace, endpoint or API key."""

    period: str = "24h"
    workspace_id: UUID | None = None
    endpoint_id: UUID | None = None
    api_key_id: int | None = None

    @property
    def granularity(self) -> str:
        return PERIODS[self.period][2]

    def window(self, now: datetime | None = None) -> tuple[datetime, datetime, timedelta]:
        """(first bucket start, end, bucket length) of the period ending now."""
        now = now or datetime.now(UTC)
        step = timedelta(minutes=1) if self.granularity == Granularity.MINUTE else timedelta(hours=1)
        end = _floor(now, step) + step
        return end - PERIODS[self.period][1], end, step


def _floor(moment: datetime, step: timedelta) -> datetime:
    moment = moment.replace(second=0, microsecond=0)
    return moment.replace(minute=0) if step >= timedelta(hours=1) else moment


def usage_rollups(*, user: AnyUser, query: UsageQuery, now: datetime | None = None) -> QuerySet[UsageRollup]:
    """The rollups of `query`'s period and filters in `user`'s workspaces.

    Filtering by endpoint or API key keeps only endpoint rows (node time belongs to no endpoint).
    """
    start, end, _ = query.window(now)
    rows = UsageRollup.objects.filter(
        workspace_id__in=workspace_ids(user=user),
        granularity=query.granularity,
        bucket_start__gte=start,
        bucket_start__lt=end,
    )
    grant = getattr(user, "api_key_grant", None)
    if grant is not None:  # a key limited to chosen endpoints sees only theirs of the endpoint rows
        rows = rows.filter(~Q(subject_kind=SubjectKind.ENDPOINT) | key_endpoint_limit(user=user, field="subject_id"))
    if query.workspace_id is not None:
        rows = rows.filter(workspace_id=query.workspace_id)
    if query.endpoint_id is not None:
        rows = rows.filter(subject_kind=SubjectKind.ENDPOINT, subject_id=query.endpoint_id)
    if query.api_key_id is not None:
        rows = rows.filter(subject_kind=SubjectKind.ENDPOINT, api_key_id=query.api_key_id)
    return rows


def _sums() -> dict[str, Any]:
    return {name: Sum(name) for name in COUNTERS} | {"latency_ms_max": Max("latency_ms_max")}


def usage_totals(*, rows: QuerySet[UsageRollup]) -> dict[str, float]:
    """The period's totals (zeros when nothing was recorded), with the mean latency and hours."""
    totals = {k: v or 0 for k, v in rows.aggregate(**_sums()).items()}
    return _derived(totals)


def _derived(values: dict[str, Any]) -> dict[str, Any]:
    requests = values.get("requests") or 0
    values["latency_ms_mean"] = (values.get("latency_ms_sum") or 0) / requests if requests else None
    for name in ("node", "gpu", "container", "cpu_core"):
        values[f"{name}_hours"] = (values.get(f"{name}_seconds") or 0) / 3600
    values["memory_gib_hours"] = (values.get("memory_mib_seconds") or 0) / 1024 / 3600
    return values


def usage_series(*, rows: QuerySet[UsageRollup], query: UsageQuery, now: datetime | None = None) -> list[dict]:
    """One dict of sums per bucket of the period (oldest first, empty buckets as zeros), with `bucket_start`."""
    start, end, step = query.window(now)
    found = {r["bucket_start"]: r for r in rows.values("bucket_start").annotate(**_sums()).order_by()}
    out = []
    moment = start
    while moment < end:
        bucket = found.get(moment) or {name: 0 for name in COUNTERS}
        out.append(_derived({**bucket, "bucket_start": moment}))
        moment += step
    return out


def usage_by_subject(*, rows: QuerySet[UsageRollup]) -> list[dict[str, Any]]:
    """The period's sums per subject and API key, each with its name (endpoints and clusters that are gone
    are named by their id), endpoints first, the busiest first."""
    grouped = list(
        rows.values("workspace_id", "subject_kind", "subject_id", "api_key_id").annotate(**_sums()).order_by()
    )
    name_subjects(grouped)
    for row in grouped:
        _derived(row)
    grouped.sort(key=lambda r: (r["subject_kind"] != SubjectKind.ENDPOINT, -(r["requests"] or 0), r["name"]))
    return grouped


def name_subjects(rows: list[dict[str, Any]]) -> None:
    """Set `name` and `api_key_name` on each dict of `rows` (with subject_kind, subject_id, api_key_id):
    endpoints, clusters and keys that are gone are named by their id (3 queries)."""
    ids = {r["subject_id"] for r in rows}
    names: dict[UUID, str] = {e.pk: f"endpoint-{e.slug} ({e.model_id})" for e in Endpoint.objects.filter(pk__in=ids)}
    names |= {c.pk: c.name for c in ComputeCluster.objects.filter(pk__in=ids)}
    key_ids = {r["api_key_id"] for r in rows if r["api_key_id"] is not None}
    keys = {k.pk: f"{k.name} ({k.display})" for k in ApiKey.objects.filter(pk__in=key_ids)}
    for row in rows:
        row["name"] = names.get(row["subject_id"], f"deleted {row['subject_kind']} {str(row['subject_id'])[:8]}")
        key_id = row["api_key_id"]
        row["api_key_name"] = "" if key_id is None else keys.get(key_id, f"deleted key {key_id}")


def usage_export_rows(*, rows: QuerySet[UsageRollup]) -> QuerySet[UsageRollup]:
    """Every rollup of the period in a stable order (the CSV export)."""
    return rows.order_by("bucket_start", "workspace_id", "subject_kind", "subject_id", "api_key_id")


def usage_api_keys(*, user: AnyUser) -> QuerySet[ApiKey]:
    """The API keys a user may filter usage by, shown by name: every key of their workspaces (a member's
    usage report names other members' keys too), revoked ones included, by name."""
    return (
        ApiKey.objects.filter(workspace_id__in=workspace_ids(user=user))
        .select_related("workspace")
        .order_by("name", "created_at")
    )


def usage_endpoints(*, user: AnyUser) -> QuerySet[Endpoint]:
    """The endpoints a user may filter usage by (their workspaces' endpoints)."""
    return Endpoint.objects.filter(
        key_endpoint_limit(user=user), cluster__workspace_id__in=workspace_ids(user=user)
    ).order_by("slug")


def price_versions() -> list[costing.Prices]:
    """Every version of the price table, oldest first (one query)."""
    return [costing.Prices.of(version) for version in PriceVersion.objects.order_by("effective_from")]


@dataclass
class Costs:
    """A period's cost: in all, per subject and API key (`KEY`), per bucket; `unpriced`: some usage fell
    before the first price version (it costs nothing)."""

    currency: str
    total: Decimal
    by_subject: dict[tuple, Decimal]
    by_bucket: dict[datetime, Decimal]
    unpriced: bool


def usage_costs(*, rows: QuerySet[UsageRollup], versions: list[costing.Prices] | None = None) -> Costs:
    """Cost every row of `rows` at the prices in force at its bucket's start (one query for the rows)."""
    versions = price_versions() if versions is None else versions
    costs = Costs(versions[-1].currency if versions else "", Decimal(0), {}, {}, False)
    for row in rows.values(*COSTED).iterator(chunk_size=2000):
        if costing.in_force(versions, row["bucket_start"]) is None:
            costs.unpriced = True
            continue
        cost = costing.row_cost(row, versions)
        key = tuple(row[k] for k in KEY)
        costs.total += cost
        costs.by_subject[key] = costs.by_subject.get(key, Decimal(0)) + cost
        costs.by_bucket[row["bucket_start"]] = costs.by_bucket.get(row["bucket_start"], Decimal(0)) + cost
    return costs


def budget_list(*, user: AnyUser) -> QuerySet[Budget]:
    """The budgets of `user`'s workspaces."""
    return Budget.objects.filter(workspace_id__in=workspace_ids(user=user)).select_related("workspace", "api_key")


def budget_alerts(*, user: AnyUser, now: datetime | None = None) -> list[Budget]:
    """This month's budgets of `user`'s workspaces at 80 % or more (the Usage page's banner), fullest first."""
    month = (now or datetime.now(UTC)).strftime("%Y-%m")
    rows = list(budget_list(user=user).filter(month=month).exclude(level=BudgetLevel.OK))
    return sorted(rows, key=lambda b: -max(b.shares().values(), default=0))

"""Usage writes: the proxy's batched additions and the minute's sampling of node, GPU and container time."""

from __future__ import annotations

from dataclasses import astuple, dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection, transaction
from django.db.models import Count, Q, Sum
from psycopg.types.json import Jsonb

from fleet.models import Node, NodeStatus
from fleet.usage.models import Granularity, PriceVersion, SubjectKind, UsageRollup
from fleet.workloads.models import Container, ContainerStatus

TABLE = UsageRollup._meta.db_table
KEY_COLUMNS = ("granularity", "bucket_start", "workspace_id", "subject_kind", "subject_id", "api_key_id")
ADDED = ("requests", "errors", "rate_limited", "prompt_tokens", "completion_tokens", "latency_ms_sum")
SAMPLED = ("node_seconds", "gpu_seconds", "container_seconds", "cpu_core_seconds", "memory_mib_seconds")
BY_MODEL = "gpu_seconds_by_model"  # sampled too, summed per model into the hour (`_recompute_hour_models`)


@dataclass(frozen=True, slots=True)
class Rollup:
    """One bucket's counters for one subject, as written (see `UsageRollup`)."""

    granularity: str
    bucket_start: datetime
    workspace_id: UUID
    subject_kind: str
    subject_id: UUID
    api_key_id: int | None = None
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms_sum: float = 0.0
    latency_ms_max: float = 0.0
    node_seconds: int = 0
    gpu_seconds: int = 0
    container_seconds: int = 0
    rate_limited: int = 0  # (rows are also built positionally: new fields go after it, with defaults)
    cpu_core_seconds: int = 0
    memory_mib_seconds: int = 0
    gpu_seconds_by_model: dict[str, int] = field(default_factory=dict)


COLUMNS = tuple(f.name for f in fields(Rollup))


def _upsert(rows: list[Rollup], assignments: str) -> None:
    placeholders = "(" + ", ".join(["%s"] * len(COLUMNS)) + ")"
    sql = (
        f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) VALUES {', '.join([placeholders] * len(rows))} "
        f"ON CONFLICT ({', '.join(KEY_COLUMNS)}) DO UPDATE SET {assignments}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [Jsonb(v) if isinstance(v, dict) else v for row in rows for v in astuple(row)])


def usage_add(*, rows: list[Rollup]) -> None:
    """Add `rows` to their buckets in one statement (rows that do not exist yet are made).

    Rows that share a bucket key (two minutes of one hour give two additions to the same hour row) are
    added up here first: PostgreSQL's upsert may touch a row only once per statement.
    """
    if not rows:
        return
    rows = _added_up(rows)
    added = [f"{c} = {TABLE}.{c} + EXCLUDED.{c}" for c in ADDED]
    added.append(f"latency_ms_max = GREATEST({TABLE}.latency_ms_max, EXCLUDED.latency_ms_max)")
    _upsert(rows, ", ".join(added))


def _added_up(rows: list[Rollup]) -> list[Rollup]:
    """`rows` with those of one bucket key merged: the added counters summed, the latency maximum kept."""
    merged: dict[tuple, Rollup] = {}
    for row in rows:
        key = tuple(getattr(row, c) for c in KEY_COLUMNS)
        seen = merged.get(key)
        if seen is None:
            merged[key] = row
            continue
        sums = {c: getattr(seen, c) + getattr(row, c) for c in ADDED}
        merged[key] = replace(seen, latency_ms_max=max(seen.latency_ms_max, row.latency_ms_max), **sums)
    return list(merged.values())


def usage_sample(*, now: datetime | None = None) -> int:
    """Credit each cluster with the node, GPU and container seconds of the minute that just ended.

    A node counts when it is not offline, its tunnel is connected and its last heartbeat is fresher than
    NODE_OFFLINE_AFTER_S (so no write per heartbeat is needed); a container when it is running on such a
    node. The minute's row is *set*, and its hour row recomputed from its minutes, so a second run for the
    same minute changes nothing. Also drops minute rows older than USAGE_MINUTE_RETENTION_DAYS.
    Returns how many clusters were credited.
    """
    now = now or datetime.now(UTC)
    minute = now.replace(second=0, microsecond=0) - timedelta(minutes=1)
    hour = minute.replace(minute=0)
    fresh_since = now - timedelta(seconds=settings.NODE_OFFLINE_AFTER_S)
    live = Q(connected=True, last_heartbeat_at__gte=fresh_since) & ~Q(status=NodeStatus.OFFLINE)
    nodes = (
        Node.objects.filter(live)
        .values("cluster_id", "cluster__workspace_id")
        .annotate(nodes=Count("id"), gpus=Sum("gpu_count"), cores=Sum("cpu_count"), mib=Sum("memory_total_mb"))
    )
    by_model: dict[UUID, dict[str, int]] = {}
    for cluster_id, model, gpus in (
        Node.objects.filter(live, gpu_count__gt=0).values_list("cluster_id", "gpu_model").annotate(Sum("gpu_count"))
    ):
        seconds = by_model.setdefault(cluster_id, {})
        seconds[model or "GPU"] = seconds.get(model or "GPU", 0) + 60 * gpus
    running = dict(
        Container.objects.filter(status=ContainerStatus.RUNNING, node__in=Node.objects.filter(live))
        .values_list("cluster_id")
        .annotate(n=Count("id"))
    )
    rows = [
        Rollup(
            granularity=Granularity.MINUTE,
            bucket_start=minute,
            workspace_id=n["cluster__workspace_id"],
            subject_kind=SubjectKind.CLUSTER,
            subject_id=n["cluster_id"],
            node_seconds=60 * n["nodes"],
            gpu_seconds=60 * (n["gpus"] or 0),
            container_seconds=60 * running.get(n["cluster_id"], 0),
            cpu_core_seconds=60 * (n["cores"] or 0),
            memory_mib_seconds=60 * (n["mib"] or 0),
            gpu_seconds_by_model=by_model.get(n["cluster_id"], {}),
        )
        for n in nodes
    ]
    with transaction.atomic():
        if rows:
            _upsert(rows, ", ".join(f"{c} = EXCLUDED.{c}" for c in (*SAMPLED, BY_MODEL)))
            _recompute_hour(hour)
            _recompute_hour_models(hour)
        UsageRollup.objects.filter(
            granularity=Granularity.MINUTE,
            bucket_start__lt=now - timedelta(days=settings.USAGE_MINUTE_RETENTION_DAYS),
        ).delete()
    return len(rows)


def _recompute_hour(hour: datetime) -> None:
    """Set the sampled seconds of the clusters' hour rows of `hour` to the sum of their minute rows."""
    taken = {"granularity": "%s", "bucket_start": "%s", "api_key_id": "NULL", BY_MODEL: "'{}'::jsonb"}
    taken |= {c: c for c in ("workspace_id", "subject_kind", "subject_id")} | {c: f"SUM({c})" for c in SAMPLED}
    selected = ", ".join(taken.get(c, "0") for c in COLUMNS)  # the request counters: 0
    sql = (
        f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) "
        f"SELECT {selected} FROM {TABLE} "
        f"WHERE granularity = %s AND subject_kind = %s AND bucket_start >= %s AND bucket_start < %s "
        f"GROUP BY workspace_id, subject_kind, subject_id "
        f"ON CONFLICT ({', '.join(KEY_COLUMNS)}) DO UPDATE SET " + ", ".join(f"{c} = EXCLUDED.{c}" for c in SAMPLED)
    )
    params = [Granularity.HOUR, hour, Granularity.MINUTE, SubjectKind.CLUSTER, hour, hour + timedelta(hours=1)]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _recompute_hour_models(hour: datetime) -> None:
    """Set the clusters' hour rows' GPU seconds per model to the sums of their minute rows' (one statement)."""
    sql = (
        f"UPDATE {TABLE} AS h SET {BY_MODEL} = s.models FROM ("
        f"  SELECT workspace_id, subject_id, jsonb_object_agg(model, seconds) AS models FROM ("
        f"    SELECT workspace_id, subject_id, kv.key AS model, SUM(kv.value::bigint) AS seconds"
        f"    FROM {TABLE}, jsonb_each_text({BY_MODEL}) AS kv"
        f"    WHERE granularity = %s AND subject_kind = %s AND bucket_start >= %s AND bucket_start < %s"
        f"    GROUP BY workspace_id, subject_id, kv.key) AS m"
        f"  GROUP BY workspace_id, subject_id) AS s "
        f"WHERE h.granularity = %s AND h.bucket_start = %s AND h.subject_kind = %s AND h.api_key_id IS NULL"
        f" AND h.workspace_id = s.workspace_id AND h.subject_id = s.subject_id"
    )
    params = [Granularity.MINUTE, SubjectKind.CLUSTER, hour, hour + timedelta(hours=1)]
    params += [Granularity.HOUR, hour, SubjectKind.CLUSTER]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


PRICE_FIELDS = (
    "currency",
    "node_hour",
    "cluster_node_hour",
    "gpu_hour",
    "gpu_model_hour",
    "cpu_core_hour",
    "memory_gib_hour",
    "prompt_per_million",
    "completion_per_million",
    "endpoint_tokens",
    "note",
)


def price_version_create(
    *, actor: Any, effective_from: datetime, now: datetime | None = None, **prices: Any
) -> PriceVersion:
    """A new version of the price table from `effective_from` (staff only): on a whole hour, not before the
    current hour (past periods keep the prices they were costed at), after every earlier version."""
    if not getattr(actor, "is_staff", False):
        raise PermissionDenied("Only operators (staff) set prices.")
    unknown = set(prices) - set(PRICE_FIELDS)
    if unknown:
        raise ValidationError({name: "Not a price field." for name in sorted(unknown)})
    version = PriceVersion(effective_from=effective_from, created_by=actor, **prices)
    errors = price_version_errors(version, now=now or datetime.now(UTC))
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        if PriceVersion.objects.select_for_update().filter(effective_from__gte=effective_from).exists():
            raise ValidationError({"effective_from": "A version from this time or later exists already."})
        version.save()
    return version


def price_version_errors(version: PriceVersion, *, now: datetime) -> dict[str, str]:
    """What is wrong with a new price version (empty: nothing), by field: the rules of `price_version_create`."""
    errors: dict[str, str] = {}
    effective_from = version.effective_from
    if effective_from is None or effective_from.tzinfo is None:
        errors["effective_from"] = "Give a time with its time zone (UTC)."
    elif effective_from.minute or effective_from.second or effective_from.microsecond:
        errors["effective_from"] = "Prices change on a whole hour (hour rollups are costed whole)."
    elif effective_from < now.replace(minute=0, second=0, microsecond=0):
        errors["effective_from"] = "A past period keeps its prices: start the new version this hour or later."
    for name in ("cluster_node_hour", "gpu_model_hour"):
        if not _all_prices(getattr(version, name)):
            errors[name] = "An object of non-negative prices."
    tokens = version.endpoint_tokens
    if not isinstance(tokens, dict) or not all(
        isinstance(v, dict) and set(v) <= {"prompt", "completion"} and _all_prices(v) for v in tokens.values()
    ):
        errors["endpoint_tokens"] = 'An object: {"<endpoint id>": {"prompt": price, "completion": price}}.'
    try:
        version.full_clean(exclude=["created_by", "effective_from"])
    except ValidationError as exc:
        for name, messages in exc.message_dict.items():
            errors.setdefault(name, " ".join(messages))
    return errors


def _all_prices(mapping: Any) -> bool:
    if not isinstance(mapping, dict):
        return False
    try:
        return all(Decimal(str(v)) >= 0 for v in mapping.values())
    except (ArithmeticError, ValueError):
        return False

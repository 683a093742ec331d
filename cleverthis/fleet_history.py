"""The fleet over the last hour, per workspace: the rollups behind the home page's charts.

Sampled once a minute by beat (`cleverthis.tasks.sample_fleet_history`, three queries for the whole
fleet, one Redis write): nodes by state, CPU/memory/GPU/VRAM use across the workspace's reporting nodes
(weighted by cores, memory and GPUs), Ray clusters by state. Endpoint requests and their latency are
counted by the proxy as they pass (`fleet.proxy.request_meter`). Commands per minute are read from the
Command rows themselves (one grouped query over the last hour, on the cluster/created index).
All kept in `kernel.timeseries`.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable
from typing import Any

from django.db.models import Count, F, FloatField, Q, Sum
from django.db.models.functions import Cast, TruncMinute

from fleet.models import Command, CommandStatus, Node, NodeStatus
from kernel import timeseries
from raymgr.models import RayCluster, RayClusterStatus
from tenancy.models import Workspace

NODE_STATES = [s.value for s in NodeStatus]
RAY_STATES = [s.value for s in RayClusterStatus]
# utilization counts only nodes whose figures are live (`Node.reporting`)
_REPORTING = Q(connected=True) & ~Q(status=NodeStatus.OFFLINE)


def _weighted(value: str, weight: str) -> Sum:
    return Sum(Cast(F(value), FloatField()) * Cast(F(weight), FloatField()), filter=_REPORTING)


def fleet_history_sample(*, now: float | None = None) -> int:
    """Record this minute's nodes by state, utilization and Ray clusters by state for every workspace.

    Three queries whatever the fleet's size, and one Redis call. Returns how many workspaces it sampled.
    """
    now = now if now is not None else time.time()
    samples: dict[Any, dict[str, float]] = {
        pk: {**{f"nodes.{s}": 0 for s in NODE_STATES}, **{f"ray.{s}": 0 for s in RAY_STATES}}
        for pk in Workspace.objects.values_list("pk", flat=True)
    }
    nodes = (
        Node.objects.order_by()
        .values("cluster__workspace_id")
        .annotate(
            **{f"n_{s}": Count("pk", filter=Q(status=s)) for s in NODE_STATES},
            cpu=_weighted("cpu_percent", "cpu_count"),
            cpus=Sum("cpu_count", filter=_REPORTING),
            memory=_weighted("memory_percent", "memory_total_mb"),
            memory_mb=Sum("memory_total_mb", filter=_REPORTING),
            gpu=_weighted("gpu_utilization_percent", "gpu_count"),
            gpus=Sum("gpu_count", filter=_REPORTING),
            vram_used=Sum("vram_used_mb", filter=_REPORTING),
            vram_total=Sum("vram_total_mb", filter=_REPORTING),
        )
    )
    for row in nodes:
        sample = samples.get(row["cluster__workspace_id"])
        if sample is None:
            continue
        sample.update({f"nodes.{s}": row[f"n_{s}"] for s in NODE_STATES})
        for measure, used, total in (
            ("util.cpu", row["cpu"], row["cpus"]),
            ("util.memory", row["memory"], row["memory_mb"]),
            ("util.gpu", row["gpu"], row["gpus"]),
            ("util.vram", 100.0 * (row["vram_used"] or 0), row["vram_total"]),
        ):
            if total:
                sample[measure] = round(min(max(used / total, 0.0), 100.0), 2)
    rays = RayCluster.objects.order_by().values("workspace_id", "status").annotate(n=Count("pk"))
    for row in rays:
        if row["workspace_id"] in samples and row["status"] in RAY_STATES:
            samples[row["workspace_id"]][f"ray.{row['status']}"] = row["n"]
    timeseries.record(
        [
            timeseries.Write(timeseries.workspace_series(pk), measure, value, at=now)
            for pk, sample in samples.items()
            for measure, value in sample.items()
        ],
        now=now,
    )
    return len(samples)


def commands_per_minute(*, cluster_workspaces: dict[Any, Any], now: float | None = None) -> dict[Any, list[dict]]:
    """Commands created per minute over the window, and how many of them failed, per workspace.

    `cluster_workspaces` maps the clusters to read (the user's) to their workspace. One grouped query on
    the (cluster, system, created_at) index; none without clusters.
    """
    minutes = timeseries.window(now=now)
    out: dict[Any, list[dict]] = {ws: [{} for _ in minutes] for ws in set(cluster_workspaces.values())}
    if not cluster_workspaces:
        return out
    since = dt.datetime.fromtimestamp(minutes[0] * timeseries.STEP_S, tz=dt.UTC)
    rows = (
        Command.objects.filter(cluster_id__in=list(cluster_workspaces), system__in=[False, True], created_at__gte=since)
        .order_by()
        .annotate(minute=TruncMinute("created_at"))
        .values("cluster_id", "minute")
        .annotate(n=Count("pk"), failed=Count("pk", filter=Q(status=CommandStatus.FAILED)))
    )
    first = minutes[0]
    for row in rows:
        i = timeseries.minute_of(row["minute"].timestamp()) - first
        if not 0 <= i < len(minutes):
            continue
        bucket = out[cluster_workspaces[row["cluster_id"]]][i]
        bucket["commands.sent"] = bucket.get("commands.sent", 0) + row["n"]
        bucket["commands.failed"] = bucket.get("commands.failed", 0) + row["failed"]
    return out


def fleet_history(*, workspace_ids: Iterable[Any], now: float | None = None) -> dict[Any, list[dict[str, float]]]:
    """Each workspace's sampled and counted measures per minute over the window (Redis only, no query)."""
    ids = list(workspace_ids)
    read = timeseries.read([timeseries.workspace_series(pk) for pk in ids], now=now)
    return {pk: read.get(timeseries.workspace_series(pk), []) for pk in ids}

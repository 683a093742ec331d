"""What containers and endpoints count against a workspace's quotas (`cleverthis.tenancy.quotas`).

A container counts while it occupies its node (`ContainerStatus.active()`: pending, running, stopping),
with the CPU cores, memory and GPUs its create payload requested; an endpoint counts while it is live
(`EndpointStatus.live()`), with its GPUs and minimum VRAM. `register()` hands the provider to tenancy at
app start; the services call `admit` with the asks below before they write the rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from django.db.models import Count, FloatField, Sum, Value
from django.db.models.fields.json import KT
from django.db.models.functions import Cast, Coalesce

from cleverthis.tenancy import quotas
from fleet.workloads.models import Container, ContainerStatus, Endpoint, EndpointStatus

CONTAINER_QUOTAS = frozenset({"containers", "cpu_cores", "memory_gib", "gpus"})
ENDPOINT_QUOTAS = frozenset({"endpoints", "gpus", "vram_gib"})
MB_PER_GIB = 1024


def _spec_sum(key: str) -> Coalesce:
    return Coalesce(Sum(Cast(KT(f"spec__{key}"), FloatField())), Value(0.0))


def workload_usage(workspace_ids: Sequence[Any], names: frozenset[str]) -> dict[Any, dict[str, float]]:
    """The usage provider: per workspace, what its active containers and live endpoints request (at most
    two queries, none for quotas it does not measure)."""
    out: dict[Any, dict[str, float]] = {}
    if names & CONTAINER_QUOTAS:
        rows = (
            Container.objects.filter(cluster__workspace_id__in=workspace_ids, status__in=ContainerStatus.active())
            .values("cluster__workspace_id")
            .annotate(n=Count("pk"), cpu=_spec_sum("cpu"), mem=_spec_sum("memory_mb"), gpus=_spec_sum("gpus"))
        )
        for r in rows:
            row = out.setdefault(r["cluster__workspace_id"], {})
            row.update(containers=r["n"], cpu_cores=r["cpu"], memory_gib=r["mem"] / MB_PER_GIB, gpus=r["gpus"])
    if names & ENDPOINT_QUOTAS:
        rows = (
            Endpoint.objects.filter(cluster__workspace_id__in=workspace_ids, status__in=EndpointStatus.live())
            .values("cluster__workspace_id")
            .annotate(n=Count("pk"), gpus=Sum("gpus", default=0), vram=Sum("min_vram_mb", default=0))
        )
        for r in rows:
            row = out.setdefault(r["cluster__workspace_id"], {})
            row["endpoints"] = r["n"]
            row["gpus"] = row.get("gpus", 0) + r["gpus"]
            row["vram_gib"] = r["vram"] / MB_PER_GIB
    return out


def container_ask(payload: Mapping[str, Any], copies: int = 1) -> dict[str, float]:
    """What `copies` containers of a container.create payload ask of the quotas."""
    return {
        "containers": copies,
        "cpu_cores": float(payload.get("cpu") or 0) * copies,
        "memory_gib": int(payload.get("memory_mb") or 0) * copies / MB_PER_GIB,
        "gpus": int(payload.get("gpus") or 0) * copies,
    }


def endpoint_ask(*, gpus: int, min_vram_mb: int) -> dict[str, float]:
    """What one endpoint asks of the quotas."""
    return {"endpoints": 1, "gpus": gpus, "vram_gib": min_vram_mb / MB_PER_GIB}


def register() -> None:
    """Hand the provider to tenancy (called from `FleetConfig.ready()`)."""
    quotas.register_usage("fleet.workloads", workload_usage)

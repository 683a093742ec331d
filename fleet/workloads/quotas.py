"""What containers and endpoints count against a workspace's quotas (`tenancy.quotas`).

A container counts while it occupies its node (`ContainerStatus.active()`: pending, running, stopping),
with the CPU cores, memory and GPUs its create payload requested (`Container.req_*`, kept in columns so
the check sums plain numbers); an endpoint counts once while it is live or scaled to zero
(`EndpointStatus.kept()`: an idle endpoint still answers on its URL and starts again on the next request,
so it keeps its place in the `endpoints` quota, while it holds no GPU or VRAM), and each of its replicas
with what its server really holds on its node while that replica is live with its start queued
(`replica_hold`: on a GPU node at least one GPU, whatever the endpoint asked, as the agent pins them, and
vLLM's share of those GPUs' memory; kept on the replica's row), less what of that its Ray node already holds
for a distributed endpoint's rank (`covered_*`: the Ray node counts it, `raymgr.quotas`) while that Ray node is
live; once it failed or stopped, the rank still live (left behind on an offline node) is charged in full
(`ranks_charge_released`, every healing pass). A replica is admitted by
`endpoint_record_start_commands` just before its start links to it; so is the replica a cold start brings
back, asking GPUs and VRAM but no endpoint.
`register()` hands the provider to tenancy at app start; the services call `admit` with the asks below
before they write the rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import Count, F, FloatField, QuerySet, Sum, Value

from agent import protocol
from fleet.models import Node
from fleet.workloads.models import Container, ContainerStatus, Endpoint, EndpointReplica, EndpointStatus
from tenancy import quotas

CONTAINER_QUOTAS = frozenset({"containers", "cpu_cores", "memory_gib", "gpus"})
REPLICA_QUOTAS = frozenset({"gpus", "vram_gib"})
MB_PER_GIB = 1024
MB_PER_GIB_F = Value(1024.0, FloatField())


def workload_usage(workspace_ids: Sequence[Any], names: frozenset[str]) -> list[QuerySet]:
    """The usage provider: per workspace, what its active containers and live endpoints request (only the
    parts measuring quotas in `names`)."""
    parts = []
    if names & CONTAINER_QUOTAS:
        active = Container.objects.filter(cluster__workspace_id__in=workspace_ids, status__in=ContainerStatus.active())
        parts.append(
            quotas.usage_rows(
                active,
                workspace_field="cluster__workspace_id",
                containers=Count("pk"),
                cpu_cores=Sum("req_cpus"),
                memory_gib=Sum("req_memory_mb") / MB_PER_GIB_F,
                gpus=Sum("req_gpus"),
            )
        )
    if "endpoints" in names:
        live = Endpoint.objects.filter(cluster__workspace_id__in=workspace_ids, status__in=EndpointStatus.kept())
        parts.append(quotas.usage_rows(live, workspace_field="cluster__workspace_id", endpoints=Count("pk")))
    if names & REPLICA_QUOTAS:
        replicas = EndpointReplica.objects.filter(
            endpoint__cluster__workspace_id__in=workspace_ids,
            status__in=EndpointStatus.live(),
            start_command__isnull=False,
        )
        parts.append(
            quotas.usage_rows(
                replicas,
                workspace_field="endpoint__cluster__workspace_id",
                gpus=Sum(F("held_gpus") - F("covered_gpus")),
                vram_gib=Sum(F("held_vram_mb") - F("covered_vram_mb")) / MB_PER_GIB_F,
            )
        )
    return parts


def container_requests(payload: protocol.ContainerCreatePayload | None) -> dict[str, Any]:
    """The `Container.req_*` fields of a container.create payload (None, an unreadable one: nothing)."""
    if payload is None:
        return {"req_cpus": 0.0, "req_memory_mb": 0, "req_gpus": 0}
    return {"req_cpus": float(payload.cpu), "req_memory_mb": payload.memory_mb, "req_gpus": payload.gpus}


def container_ask(payload: protocol.ContainerCreatePayload | None, copies: int = 1) -> dict[str, float]:
    """What `copies` containers of a container.create payload ask of the quotas."""
    req = container_requests(payload)
    return {
        "containers": copies,
        "cpu_cores": req["req_cpus"] * copies,
        "memory_gib": req["req_memory_mb"] * copies / MB_PER_GIB,
        "gpus": req["req_gpus"] * copies,
    }


def endpoint_ask(*, gpus: int, min_vram_mb: int, replicas: int = 1) -> dict[str, float]:
    """What one new endpoint with `replicas` replicas asks of the quotas."""
    return {"endpoints": 1, **replica_ask(gpus=gpus, min_vram_mb=min_vram_mb, replicas=replicas)}


def replica_ask(*, gpus: int, min_vram_mb: int, replicas: int = 1) -> dict[str, float]:
    """What `replicas` more servers holding `gpus` GPUs and `min_vram_mb` MB of VRAM each ask of the quotas."""
    return {"gpus": gpus * replicas, "vram_gib": min_vram_mb * replicas / MB_PER_GIB}


def replica_hold(payload: protocol.EndpointStartPayload, node: Node | None) -> tuple[int, int]:
    """(GPUs, VRAM MB) one server started with endpoint.start `payload` holds on `node`, by the agent's rule
    (`agent.protocol.endpoint_gpus_held`, `endpoint_vram_held_mb`): on a node with GPUs at least one GPU and
    vLLM's share of its memory, even when the endpoint asked for none; never less than it asked."""
    gpus, min_vram_mb = payload.gpus, payload.min_vram_mb
    node_gpus = list(node.gpus or []) if node is not None else []
    if node is not None and not node_gpus and node.gpu_count:  # GPUs counted, not described: their VRAM evenly
        each = node.vram_total_mb // node.gpu_count
        node_gpus = [{"index": i, "memory_total_mb": each} for i in range(node.gpu_count)]
    held = protocol.endpoint_gpus_held(gpus=gpus, min_vram_mb=min_vram_mb, node_gpus=len(node_gpus))
    args, problems = protocol.check_server_args(list(payload.extra_args))
    vram = protocol.endpoint_vram_held_mb(
        gpus=gpus, min_vram_mb=min_vram_mb, node_gpus=node_gpus, server_args=[] if problems else args
    )
    return held, vram


def register() -> None:
    """Hand the provider to tenancy (called from `FleetConfig.ready()`)."""
    quotas.register_usage("fleet.workloads", workload_usage)

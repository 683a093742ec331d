"""Where an endpoint's replicas go: a node of the cluster holding the model's weights with enough GPUs and
free VRAM (counting what replicas still starting were promised) — on a node without GPUs, a core of its own
and the memory of a vLLM CPU server (`agent.protocol.cpu_engine`) — distinct nodes first, the least busy
first; `PlacementError` (409) saying why when none fits."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.db.models import Count, Q, Sum

from agent import protocol
from agent.protocol.cpu_engine import CPU_ENDPOINT_CORES, cpu_endpoint_memory_mb
from fleet.models import Command, ComputeCluster, Node, NodeStatus
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus, NodeModel
from fleet.workloads.services.endpoints.replicas import replica_queue_start
from kernel.exceptions import IllegalTransition


def node_free_vram_mb(node: Node, gpus: int = 0) -> int:
    """Free VRAM: on the `gpus` GPUs with most free memory, or on all GPUs when `gpus` is 0."""
    per_gpu = sorted(
        (max(int(g.get("memory_total_mb", 0)) - int(g.get("memory_used_mb", 0)), 0) for g in node.gpus or []),
        reverse=True,
    )
    if not per_gpu:
        return max(node.vram_total_mb - node.vram_used_mb, 0)
    return sum(per_gpu[:gpus] if gpus > 0 else per_gpu)


class PlacementError(IllegalTransition):
    """No node can take the workload (HTTP 409); `code` is a key of `error_help`."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def _endpoint_load(node_ids: list[Any]) -> dict[Any, tuple[int, int]]:
    """Per node: (live endpoint replicas, VRAM reserved by replicas still starting, not yet in heartbeats)."""
    rows = (
        EndpointReplica.objects.filter(node_id__in=node_ids, status__in=EndpointStatus.live())
        .values("node_id")
        .annotate(
            n=Count("pk"),
            reserved=Sum(
                "endpoint__min_vram_mb",
                filter=Q(status__in=[EndpointStatus.PENDING, EndpointStatus.STARTING]),
                default=0,
            ),
        )
    )
    return {r["node_id"]: (r["n"], r["reserved"]) for r in rows}


def _cpu_shortfalls(nodes: list[Node], *, model_id: str, revision: str) -> dict[Any, tuple[str, str]]:
    """Per node without GPUs that cannot take one more vLLM CPU server: (why, error code). Each live replica
    there holds `CPU_ENDPOINT_CORES` cores of the node's reported cores and its model's weights, KV cache and
    vLLM's own memory (`cpu_endpoint_memory_mb`) of its reported memory, as VRAM is counted on GPU nodes."""
    if not nodes:
        return {}
    sizes = {(m.node_id, m.model_id, m.revision): m.size_bytes for m in NodeModel.objects.filter(node__in=nodes)}
    held: dict[Any, list[int]] = {n.pk: [] for n in nodes}
    for node_id, replica_model, replica_revision in EndpointReplica.objects.filter(
        node__in=nodes, status__in=EndpointStatus.live()
    ).values_list("node_id", "endpoint__model_id", "endpoint__revision"):
        size = sizes.get((node_id, replica_model, replica_revision), 0)
        held[node_id].append(cpu_endpoint_memory_mb(weights_bytes=size))
    short = {}
    for n in nodes:
        servers, memory = len(held[n.pk]), sum(held[n.pk])
        needed = cpu_endpoint_memory_mb(weights_bytes=sizes.get((n.pk, model_id, revision), 0))
        if n.cpu_count and (servers + 1) * CPU_ENDPOINT_CORES > n.cpu_count:
            short[n.pk] = (
                f"insufficient CPU cores: a vLLM CPU server needs {CPU_ENDPOINT_CORES} core(s) of its own; node "
                f"{n.name} has {n.cpu_count}, held by the {servers} endpoint server(s) it runs",
                "insufficient_cpu",
            )
        elif n.memory_total_mb and memory + needed > n.memory_total_mb:
            short[n.pk] = (
                f"insufficient memory: a vLLM CPU server of {model_id} needs about {needed} MB (weights, KV cache "
                f"and vLLM itself); node {n.name} has {n.memory_total_mb} MB, {memory} MB held by the {servers} "
                "endpoint server(s) it runs",
                "insufficient_memory",
            )
    return short


def pick_endpoint_node(
    *,
    cluster: ComputeCluster,
    model_id: str,
    revision: str,
    gpus: int,
    min_vram_mb: int,
    node: Node | None,
    avoid: Collection[Any] = (),
) -> Node:
    """Choose a node that has the model cached and enough GPUs/VRAM; PlacementError saying why not.

    Free VRAM counts the VRAM promised to replicas that are still starting (not yet visible in the
    node's heartbeats). Among fitting nodes one not in `avoid` (the ids of nodes already serving this
    endpoint) wins where there is one, then the one with the fewest live replicas, then the most free VRAM.
    """
    label = f"{model_id}@{revision}"
    if node is not None:
        node = Node.objects.get(pk=node.pk)
        if node.status != NodeStatus.ONLINE or not node.connected:
            raise IllegalTransition(f"Node {node.name} is {node.status}; endpoints start only on online nodes.")
        candidates = [node]
        if not NodeModel.objects.filter(node=node, model_id=model_id, revision=revision).exists():
            raise PlacementError(
                f"model weights are not yet downloaded: {label} is not in node {node.name}'s cache; "
                "run model.download on it first",
                "weights_missing",
            )
    else:
        candidates = list(
            Node.objects.filter(
                cluster=cluster,
                status=NodeStatus.ONLINE,
                connected=True,
                cached_models__model_id=model_id,
                cached_models__revision=revision,
            ).order_by("name", "pk")
        )
        if not candidates:
            raise PlacementError(
                f"model weights are not yet downloaded: {label} is on no online node; run model.download first",
                "model_not_downloaded",
            )
    load = _endpoint_load([n.pk for n in candidates])

    def free(n: Node) -> int:
        # on the GPUs the agent will pin there (`endpoint_gpus_held`: at least one on a GPU node), not on all
        pinned = protocol.endpoint_gpus_held(gpus=gpus, min_vram_mb=min_vram_mb, node_gpus=n.gpu_count)
        return node_free_vram_mb(n, pinned) - load.get(n.pk, (0, 0))[1]

    cpu_short = _cpu_shortfalls([n for n in candidates if n.gpu_count == 0], model_id=model_id, revision=revision)
    fitting = [n for n in candidates if n.gpu_count >= gpus and free(n) >= min_vram_mb and n.pk not in cpu_short]
    if not fitting and gpus == 0 and cpu_short:
        best = next(n for n in candidates if n.pk in cpu_short)
        reason, code = cpu_short[best.pk]
        where = f"node {best.name}" if node is not None else f"every node that holds {label}; node {best.name}"
        raise PlacementError(f"{reason} ({where})", code)
    if not fitting:
        best = max(candidates, key=lambda n: (n.gpu_count >= gpus, free(n)))
        where = f"node {best.name}" if node is not None else f"best node {best.name}"
        gpu_note = f" (and {gpus} GPU(s), it has {best.gpu_count})" if best.gpu_count < gpus else ""
        raise PlacementError(
            f"insufficient GPU VRAM: needs {min_vram_mb} MB{gpu_note}, {where} has {max(free(best), 0)} MB free",
            "insufficient_vram",
        )
    return min(fitting, key=lambda n: (n.pk in avoid, load.get(n.pk, (0, 0))[0], -free(n), n.name))


def pick_replica_node(
    endpoint: Endpoint, *, avoid: Collection[Any] = (), node: Node | None = None, revision: str | None = None
) -> Node:
    """Where one more replica of `endpoint` goes (`pick_endpoint_node` with its model, GPUs and VRAM; of
    `revision` when given, for a rolling update); PlacementError when it fits nowhere."""
    return pick_endpoint_node(
        cluster=endpoint.cluster,
        model_id=endpoint.model_id,
        revision=endpoint.revision if revision is None else revision,
        gpus=endpoint.gpus,
        min_vram_mb=endpoint.min_vram_mb,
        node=node,
        avoid=avoid,
    )


def place_replicas(*, actor: AbstractBaseUser, endpoint: Endpoint, node: Node | None = None) -> list[Command]:
    """Start each of the endpoint's replicas (made up to `min_replicas`, at least one) on a node of its own
    where one fits; the first replica's server id is the endpoint's slug. PlacementError (nothing kept) when
    one fits nowhere."""
    wanted = max(endpoint.min_replicas, 1)  # one that scales to zero starts with one, until it idles
    current = endpoint.replicas.filter(replacements__isnull=True).order_by("created_at", "server_id")
    replicas = list(current[:wanted])  # replicas the autoscaler added and stopped stay stopped
    while len(replicas) < wanted:
        server_id = endpoint.slug if not replicas else EndpointReplica._meta.get_field("server_id").get_default()
        replicas.append(EndpointReplica.objects.create(endpoint=endpoint, server_id=server_id))
    commands, used = [], set()
    for replica in replicas:
        target = pick_replica_node(endpoint, avoid=used, node=node)
        used.add(target.pk)
        EndpointReplica.objects.filter(pk=replica.pk).update(node=target)  # pending once its start is queued (admitted)
        commands.append(replica_queue_start(actor=actor, endpoint=endpoint, replica=replica, node=target))
    return commands

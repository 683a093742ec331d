"""Reads of the model catalog: the models a user sees (curated, and their workspaces' private ones) and, for
each, which of the user's nodes can hold it at a context and batch (`fleet.workloads.catalog.fit_on_node`),
from the GPUs and memory the nodes report, less the GPUs live endpoint replicas hold there. A constant
number of queries, whatever the number of models and nodes."""

from __future__ import annotations

import shlex
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.db.models import Q, QuerySet, Sum
from django.urls import reverse

from fleet.models import Node, NodeStatus
from fleet.workloads.catalog import Fit, ModelSpec, Quantization, cpu_memory_needed_mb, fit_on_node, vram_needed_mb
from fleet.workloads.models import CatalogModel, EndpointReplica, EndpointStatus, NodeModel
from tenancy.selectors import workspace_ids

DEFAULT_CONTEXT = 4096
MAX_CONTEXT = 10_000_000
MAX_BATCH = 4096


@dataclass
class NodeFit:
    """One node's answer for one model: the fit, and whether the node holds the weights already."""

    node: Node
    fit: Fit
    cached: bool


@dataclass
class CatalogRow:
    """One model with its need at the asked context and batch, and its fit on each node."""

    model: CatalogModel
    quantization: Quantization
    repo: str  # the repository of the chosen quantization
    context: int
    batch: int
    vram_mb: int  # on one GPU (tensor parallel 1)
    cpu_mb: int
    nodes: list[NodeFit] = field(default_factory=list)

    @property
    def fitting(self) -> list[NodeFit]:
        """The nodes that can hold it, those holding the weights first."""
        return sorted((n for n in self.nodes if n.fit.fits), key=lambda n: (not n.cached, n.node.name))

    def deploy_url(self, node_fit: NodeFit) -> str:
        """The cluster's endpoint form pre-filled with this model on that node's fit ('' for a local path)."""
        if not self.repo:
            return ""
        query = {
            "model_id": self.repo,
            "revision": self.model.revision,
            "gpus": node_fit.fit.tensor_parallel,
            # on GPUs: what the formula says its GPUs must hold together (placement checks it, as the agent does)
            "min_vram_mb": node_fit.fit.needed_mb * node_fit.fit.tensor_parallel,
            "server_args": shlex.join(self.model.server_args),
            "catalog": self.model.name,
        }
        return reverse("workloads:cluster_endpoints", args=[node_fit.node.cluster_id]) + "?" + urlencode(query)


def spec_of(model: CatalogModel) -> ModelSpec:
    """The fit computation's view of a catalog row."""
    quantizations = tuple(
        Quantization(q.get("name", "bf16"), float(q.get("bytes_per_param", 2)), q.get("model_id", ""))
        for q in model.quantizations or []
    ) or (Quantization("bf16", 2.0),)
    return ModelSpec(
        params_b=model.params_b,
        context_length=model.context_length,
        layers=model.layers,
        kv_heads=model.kv_heads,
        head_dim=model.head_dim,
        attention_heads=model.attention_heads,
        quantizations=quantizations,
    )


def catalog_list(*, user: Any, search: str = "", tag: str = "") -> QuerySet[CatalogModel]:
    """Curated models and the private models of the user's workspaces, filtered by `search` (name, repository,
    description) and `tag`."""
    models = CatalogModel.objects.filter(Q(workspace__isnull=True) | Q(workspace__in=workspace_ids(user=user)))
    if search:
        models = models.filter(
            Q(name__icontains=search) | Q(model_id__icontains=search) | Q(description__icontains=search)
        )
    if tag:
        models = models.filter(tags__contains=[tag])
    return models.select_related("workspace").order_by("workspace_id", "name", "pk")


def _server_context(model: CatalogModel) -> int:
    """The context its server arguments set (`--max-model-len`), else its full context."""
    args = list(model.server_args or [])
    for i, arg in enumerate(args):
        if arg == "--max-model-len" and i + 1 < len(args) and args[i + 1].isdigit():
            return int(args[i + 1])
    return model.context_length


def catalog_rows(
    *,
    user: Any,
    models: list[CatalogModel],
    context: int | None = None,
    batch: int = 1,
    quantization: str | None = None,
    cluster_id: Any = None,
) -> list[CatalogRow]:
    """Each model's need and its fit on each online node of the user's workspaces (of `cluster_id` when given;
    a private model only on its own workspace's nodes). `context` None: each model's server context."""
    nodes = Node.objects.filter(cluster__workspace__in=workspace_ids(user=user), status=NodeStatus.ONLINE)
    if cluster_id:
        nodes = nodes.filter(cluster_id=cluster_id)
    nodes = list(nodes.select_related("cluster").order_by("name", "pk"))
    ids = [n.pk for n in nodes]
    held = dict(
        EndpointReplica.objects.filter(node_id__in=ids, status__in=EndpointStatus.live())
        .values("node_id")
        .annotate(gpus=Sum("held_gpus"))
        .values_list("node_id", "gpus")
    )
    cached: dict[tuple[str, str], set[Any]] = defaultdict(set)
    for node_id, model_id, revision in NodeModel.objects.filter(node_id__in=ids).values_list(
        "node_id", "model_id", "revision"
    ):
        cached[(model_id, revision)].add(node_id)
    rows = []
    for model in models:
        spec = spec_of(model)
        quant = spec.quantization(quantization)
        tokens = context or _server_context(model) or DEFAULT_CONTEXT
        repo = quant.model_id or model.model_id
        row = CatalogRow(
            model=model,
            quantization=quant,
            repo=repo,
            context=tokens,
            batch=batch,
            vram_mb=vram_needed_mb(spec, quantization=quant.name, context=tokens, batch=batch),
            cpu_mb=cpu_memory_needed_mb(spec, context=tokens, batch=batch),
        )
        for node in nodes:
            if model.workspace_id and node.cluster.workspace_id != model.workspace_id:
                continue
            fit = fit_on_node(
                spec,
                gpus=node.gpus or [],
                held_gpus=int(held.get(node.pk) or 0),
                memory_free_mb=max(node.memory_total_mb - node.memory_used_mb, 0),
                quantization=quant.name,
                context=tokens,
                batch=batch,
            )
            row.nodes.append(NodeFit(node=node, fit=fit, cached=node.pk in cached.get((repo, model.revision), ())))
        rows.append(row)
    return rows

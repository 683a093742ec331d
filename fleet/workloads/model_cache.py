"""Reads of nodes' model caches: per node what is cached (model, revision, size, last used, which endpoints
serve from it), the disk free and the budget, and the downloads under way with their bytes and rate (from
the agent's latest progress step). A constant number of queries per call, whatever the number of nodes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import OuterRef, Subquery

from fleet.models import Command, CommandStatus, CommandType, Node, NodeEvent
from fleet.workloads.models import EndpointReplica, EndpointStatus, NodeCache, NodeModel

DOWNLOADING = (CommandStatus.QUEUED, CommandStatus.DISPATCHED, CommandStatus.RUNNING)


@dataclass
class Download:
    """A model.download under way: its latest progress figures (None before the first)."""

    command: Command
    model_id: str
    bytes_done: int | None = None
    bytes_total: int | None = None
    bytes_per_s: int | None = None
    percent: float | None = None


@dataclass
class CachedEntry:
    """One cached snapshot and the endpoint slugs that serve from it on its node (evict is refused then)."""

    row: NodeModel
    serving: list[str] = field(default_factory=list)


@dataclass
class NodeCacheView:
    """One node's model cache."""

    node: Node
    entries: list[CachedEntry]
    downloads: list[Download]
    disk_free_bytes: int = 0
    budget_mb: int = 0
    reported_budget_bytes: int = 0

    @property
    def used_bytes(self) -> int:
        return sum(e.row.size_bytes for e in self.entries)

    @property
    def budget_pending(self) -> bool:
        """The agent applies another budget than the one set here (until its next download)."""
        return self.reported_budget_bytes != self.budget_mb * 1024 * 1024


def downloads_in_progress(node_ids: Iterable[Any]) -> dict[Any, list[Download]]:
    """Per node: its model.download commands under way with their latest progress figures."""
    latest = NodeEvent.objects.filter(command_id=OuterRef("pk"), kind="command.progress").order_by("-created_at")
    commands = (
        Command.objects.filter(
            node_id__in=list(node_ids), command_type=CommandType.MODEL_DOWNLOAD, status__in=DOWNLOADING
        )
        .annotate(progress=Subquery(latest.values("data")[:1]))
        .order_by("created_at", "pk")
    )
    found: dict[Any, list[Download]] = defaultdict(list)
    for command in commands:
        data = command.progress if isinstance(command.progress, dict) else {}
        found[command.node_id].append(
            Download(
                command=command,
                model_id=str((command.payload or {}).get("model_id", "")),
                bytes_done=_number(data.get("bytes_done")),
                bytes_total=_number(data.get("bytes_total")),
                bytes_per_s=_number(data.get("bytes_per_s")),
                percent=data.get("percent") if isinstance(data.get("percent"), int | float) else None,
            )
        )
    return found


def _number(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def node_caches(nodes: list[Node]) -> list[NodeCacheView]:
    """Each node's model cache, downloads and figures (four queries)."""
    ids = [n.pk for n in nodes]
    rows: dict[Any, list[NodeModel]] = defaultdict(list)
    for row in NodeModel.objects.filter(node_id__in=ids).order_by("model_id", "revision", "pk"):
        rows[row.node_id].append(row)
    serving: dict[tuple[Any, str, str], set[str]] = defaultdict(set)
    for node_id, model_id, revision, slug in EndpointReplica.objects.filter(
        node_id__in=ids, status__in=EndpointStatus.live()
    ).values_list("node_id", "endpoint__model_id", "endpoint__revision", "endpoint__slug"):
        serving[(node_id, model_id, revision)].add(slug)
    caches = {c.node_id: c for c in NodeCache.objects.filter(node_id__in=ids)}
    downloads = downloads_in_progress(ids)
    views = []
    for node in nodes:
        cache = caches.get(node.pk)
        views.append(
            NodeCacheView(
                node=node,
                entries=[
                    CachedEntry(row=r, serving=sorted(serving.get((node.pk, r.model_id, r.revision), ())))
                    for r in rows.get(node.pk, [])
                ],
                downloads=downloads.get(node.pk, []),
                disk_free_bytes=cache.disk_free_bytes if cache else 0,
                budget_mb=cache.budget_mb if cache else 0,
                reported_budget_bytes=cache.reported_budget_bytes if cache else 0,
            )
        )
    return views

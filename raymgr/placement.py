"""Where Ray heads and workers go: pure functions over fleet nodes (no queries, no clock)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

# A head needs this much free RAM on its node (GCS, dashboard, object store of a small cluster).
HEAD_MIN_FREE_MB = 4096


class PlacementError(Exception):
    """No node can take the Ray node; `code` is one of no_nodes_online | insufficient_memory | port_conflict."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class NodeLike(Protocol):
    """The fleet-node facts placement looks at (a `fleet.models.Node` satisfies it)."""

    pk: Any
    name: str
    status: str
    memory_total_mb: int
    memory_used_mb: int
    gpu_count: int


def free_memory_mb(node: NodeLike) -> int:
    """RAM not in use on `node` according to its latest heartbeat."""
    return max(0, node.memory_total_mb - node.memory_used_mb)


def choose_head_node(
    nodes: Sequence[NodeLike],
    *,
    ports_in_use: Mapping[Any, Collection[int]],
    gcs_port: int | None,
    dashboard_port: int,
    min_free_mb: int = HEAD_MIN_FREE_MB,
) -> NodeLike:
    """The node for a new head: online, `min_free_mb` free RAM, both ports free; CPU nodes first.

    Among acceptable nodes, CPU-only nodes win over GPU nodes (GPUs are for workers), then the most free
    RAM, then the name. `ports_in_use` maps a node's pk to the ports other Ray heads already hold there.
    A `gcs_port` of None is picked free by the node itself: only the dashboard port is checked then.
    Raises `PlacementError` naming the first obstacle: no node online, too little memory, port conflict.
    """
    online = [n for n in nodes if n.status == "online"]
    if not online:
        raise PlacementError("no_nodes_online", "No nodes online in the compute cluster: the head cannot be placed.")
    roomy = [n for n in online if free_memory_mb(n) >= min_free_mb]
    if not roomy:
        best = max(online, key=free_memory_mb)
        raise PlacementError(
            "insufficient_memory",
            f"Insufficient memory: the head needs {min_free_mb} MB free RAM; the best online node, {best.name}, "
            f"has {free_memory_mb(best)} MB free.",
        )
    wanted = {port for port in (gcs_port, dashboard_port) if port}
    free_ports = [n for n in roomy if not wanted & set(ports_in_use.get(n.pk, ()))]
    if not free_ports:
        taken = sorted(wanted & set().union(*(set(ports_in_use.get(n.pk, ())) for n in roomy)))
        raise PlacementError(
            "port_conflict",
            f"Port conflict: port(s) {'/'.join(map(str, taken))} are already used by another Ray cluster on every "
            f"node with {min_free_mb} MB free RAM.",
        )
    return min(free_ports, key=lambda n: (n.gpu_count > 0, -free_memory_mb(n), n.name))


def choose_worker_node(
    nodes: Sequence[NodeLike],
    *,
    head_node_id: Any,
    ray_nodes_per_node: Mapping[Any, int],
    share_nodes: bool = False,
) -> NodeLike | None:
    """The node for one more worker, or None when no node can take it.

    Workers go on online nodes other than the head's, one per node (containers: one Ray node per
    machine). With `share_nodes` (the process runtime on a single machine) any online node qualifies,
    the least occupied first. Preference: more GPUs, more free RAM, then the name.
    """
    candidates = [n for n in nodes if n.status == "online"]
    if not share_nodes:
        candidates = [n for n in candidates if n.pk != head_node_id and not ray_nodes_per_node.get(n.pk)]
    if not candidates:
        return None
    return min(candidates, key=lambda n: (ray_nodes_per_node.get(n.pk, 0), -n.gpu_count, -free_memory_mb(n), n.name))

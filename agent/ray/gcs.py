"""A Ray cluster's state and node drains, read and asked through its head's GCS (stdlib plus Ray only).

Cluster state is read with Ray's autoscaler v2 SDK (``ray.autoscaler.v2.sdk.get_cluster_status``):
pending task/actor/placement-group bundles and, per node, status, total/used resources and idle time.
Draining uses the GCS ``DrainNode`` RPC (``ray._raylet.GcsClient.drain_node``, what ``ray drain-node``
calls). Ray is imported lazily, so the agent imports this module on nodes without Ray.

This module imports nothing of the project: the docker runtime runs its source inside the head container
(with `agent.ray.incontainer.helper`), so status and drain speak the cluster's own Ray version.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

# Label every node we start carries, so its Ray node id can be found from our own name for it.
NODE_LABEL = "cleverthis.io/ray-node"
HEAD_RESOURCE = "node:__internal_head__"
DRAIN_REASONS = {"idle": "DRAIN_NODE_REASON_IDLE_TERMINATION", "preemption": "DRAIN_NODE_REASON_PREEMPTION"}


@dataclass(frozen=True)
class RayNodeStatus:
    """One Ray node as the GCS reports it (fields line up with `raymgr.autoscaler.WorkerState`)."""

    node_id: str
    name: str | None  # our NODE_LABEL, when the node was started by us
    is_head: bool
    status: str  # RUNNING, IDLE, DRAINING
    idle_s: float
    resources: dict[str, float]
    available: dict[str, float]
    ip_address: str = ""
    activity: list[str] = field(default_factory=list)

    @property
    def draining(self) -> bool:
        """True once the GCS accepted a drain for this node."""
        return self.status == "DRAINING"


@dataclass(frozen=True)
class PendingDemand:
    """Pending resource bundles (one per task/actor/placement-group bundle), as `ClusterDemand.pending`."""

    bundles: list[dict[str, float]]
    # Placement groups waiting, with their strategy and bundles (already included in `bundles`).
    placement_groups: list[dict[str, Any]] = field(default_factory=list)
    # `ray.autoscaler.sdk.request_resources` constraints (not included in `bundles`).
    constraints: list[dict[str, float]] = field(default_factory=list)
    truncated: bool = False


@dataclass(frozen=True)
class RayClusterStatus:
    """A snapshot of a Ray cluster for the autoscaler: pending demand, head free capacity, live nodes."""

    demand: PendingDemand
    head_free: dict[str, float]
    nodes: list[RayNodeStatus]

    @property
    def workers(self) -> list[RayNodeStatus]:
        """Every live non-head node."""
        return [node for node in self.nodes if not node.is_head]

    def node_named(self, name: str) -> RayNodeStatus | None:
        """The live node carrying our label `name`, if any."""
        return next((node for node in self.nodes if node.name == name), None)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form for the wire."""
        return asdict(self)


def _bundles(demand: Any, limit: int) -> tuple[list[dict[str, float]], bool]:
    out: list[dict[str, float]] = []
    for by_count in demand.bundles_by_count:
        for _ in range(by_count.count):
            if len(out) >= limit:
                return out, True
            out.append({key: float(value) for key, value in by_count.bundle.items()})
    return out, False


def cluster_status(address: str, *, timeout: int = 10, max_bundles: int = 1000) -> RayClusterStatus:
    """Read a cluster's state from its GCS with ``ray.autoscaler.v2.sdk.get_cluster_status``.

    `max_bundles` caps the pending bundles listed (a queue of thousands says no more to an autoscaler
    bounded by max_workers than a thousand does); `PendingDemand.truncated` tells when it applied.
    """
    from ray.autoscaler.v2.sdk import get_cluster_status

    status = get_cluster_status(address, timeout=timeout)
    bundles: list[dict[str, float]] = []
    truncated = False
    for demand in status.resource_demands.ray_task_actor_demand:
        more, cut = _bundles(demand, max_bundles - len(bundles))
        bundles += more
        truncated |= cut
    groups = []
    for demand in status.resource_demands.placement_group_demand:
        more, cut = _bundles(demand, max_bundles - len(bundles))
        bundles += more
        truncated |= cut
        groups.append({"pg_id": demand.pg_id, "strategy": demand.strategy, "state": demand.state, "bundles": more})
    constraints = []
    for demand in status.resource_demands.cluster_constraint_demand:
        constraints += _bundles(demand, max_bundles)[0]

    nodes = []
    head_free: dict[str, float] = {}
    infos = [*status.active_nodes, *status.idle_nodes]
    # Ray before 2.10 has no labels in the autoscaler's NodeInfo: read them from the GCS node table.
    labels_of = {} if all(hasattr(i, "labels") for i in infos) else _gcs_labels(address)
    for info in infos:
        usage = info.resource_usage
        if usage is None:
            continue
        total = {u.resource_name: float(u.total) for u in usage.usage}
        available = {u.resource_name: float(u.total - u.used) for u in usage.usage}
        is_head = HEAD_RESOURCE in total
        node = RayNodeStatus(
            node_id=info.node_id or "",
            name=(getattr(info, "labels", None) or labels_of.get(info.node_id or "", {})).get(NODE_LABEL),
            is_head=is_head,
            status=info.node_status or "",
            idle_s=usage.idle_time_ms / 1000.0,
            resources=_schedulable(total),
            available=_schedulable(available),
            ip_address=info.ip_address,
            activity=list(getattr(info, "node_activity", None) or []),
        )
        nodes.append(node)
        if is_head and not node.draining:
            head_free = node.available
    demand = PendingDemand(bundles=bundles, placement_groups=groups, constraints=constraints, truncated=truncated)
    return RayClusterStatus(demand=demand, head_free=head_free, nodes=nodes)


def _gcs_labels(address: str) -> dict[str, dict[str, str]]:
    """Node id (hex) → labels, from the GCS node table (older Rays answer dicts of bytes)."""
    from ray._raylet import GcsClient

    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    found: dict[str, dict[str, str]] = {}
    for key, info in GcsClient(address=address).get_all_node_info().items():
        node_id = key.hex() if isinstance(key, bytes) else text(key)
        raw = info.get("labels", {}) if isinstance(info, dict) else getattr(info, "labels", {})
        found[node_id] = {text(k): text(v) for k, v in dict(raw or {}).items()}
    return found


def _schedulable(resources: dict[str, float]) -> dict[str, float]:
    """Drop Ray's implicit per-node resources (``node:<ip>``, ``node:__internal_head__``)."""
    return {key: value for key, value in resources.items() if not key.startswith("node:")}


def drain_node(
    address: str, node_id: str, *, reason: str = "idle", message: str = "", deadline_s: float | None = None
) -> tuple[bool, str]:
    """The GCS DrainNode RPC (``ray drain-node``): returns (accepted, rejection message)."""
    from ray._raylet import GcsClient
    from ray.core.generated import autoscaler_pb2

    if reason not in DRAIN_REASONS:
        raise ValueError(f"reason must be one of {sorted(DRAIN_REASONS)}")
    deadline_ms = 0 if deadline_s is None else int((time.time() + deadline_s) * 1000)
    args = [node_id, autoscaler_pb2.DrainNodeReason.Value(DRAIN_REASONS[reason]), message or f"cleverthis: {reason}"]
    client = GcsClient(address=address)
    try:
        answer = client.drain_node(*args, deadline_ms)
    except TypeError:  # Ray before 2.10: no deadline, and a bare "accepted"
        answer = client.drain_node(*args)
    accepted, rejection = answer if isinstance(answer, tuple) else (answer, "")
    return bool(accepted), str(rejection or "")

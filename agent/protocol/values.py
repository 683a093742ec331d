"""Value types shared by several messages: host facts, GPUs, containers, models, endpoints, the inventory."""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.protocol.versions import INVENTORY_PROBLEMS_SINCE, MODEL_CACHE_SINCE, since


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as reported by nvidia-ml-py."""

    index: int
    name: str
    uuid: str = ""
    memory_total_mb: int = 0
    memory_used_mb: int = 0
    utilization_percent: float = 0.0


@dataclass(frozen=True)
class HostFacts:
    """Static facts about the node, sent at registration and in `Hello`."""

    hostname: str
    os: str = ""
    arch: str = ""
    cpu_count: int = 0
    memory_total_mb: int = 0
    agent_version: str = ""
    gpus: list[GpuInfo] = field(default_factory=list)


@dataclass(frozen=True)
class ContainerInfo:
    """A workload container (or Deployment) that the agent manages."""

    container_id: str
    name: str
    image: str
    status: str  # created | running | exited | stopped | missing
    command_key: str = ""  # idempotency key of the container.create that made it
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CachedModel:
    """A model snapshot in the node's cache."""

    model_id: str
    revision: str
    path: str
    size_bytes: int = 0
    # When an endpoint last started from it (else when it was downloaded), the agent's time.time(): what the
    # cache budget's least-recently-used eviction goes by (0: unknown).
    last_used_at: float = field(default=0.0, metadata=since(MODEL_CACHE_SINCE))


@dataclass(frozen=True)
class EndpointInfo:
    """A running inference endpoint on the node.

    `status` is a free string (no rule, no protocol version): `unresponsive` (the server's process is alive
    but its health probes failed, `agent.workloads.endpoint_health`) came without a version step because a
    control plane that does not know a status leaves the replica as it was (as before the probes existed).
    """

    endpoint_id: str
    model_id: str
    port: int
    status: str  # starting | running | unresponsive | stopped | failed
    pid: int = 0
    container_id: str = ""


@dataclass(frozen=True)
class InventoryProblem:
    """A part of the inventory the agent could not read, and why: the executor's engine is unreachable."""

    part: str  # containers | endpoints | models
    code: str  # an ErrorCode: kubernetes_unavailable, docker_unavailable, gitops_failed, internal, ...
    message: str


@dataclass(frozen=True)
class Inventory:
    """Everything the agent runs and holds, sent on every (re)connect for reconciliation."""

    containers: list[ContainerInfo] = field(default_factory=list)
    endpoints: list[EndpointInfo] = field(default_factory=list)
    models: list[CachedModel] = field(default_factory=list)
    gpus: list[GpuInfo] = field(default_factory=list)
    completed_command_keys: list[str] = field(default_factory=list)
    # What the agent could not read for this inventory, e.g. a kubernetes executor without credentials.
    problems: list[InventoryProblem] = field(default_factory=list, metadata=since(INVENTORY_PROBLEMS_SINCE))
    # Free bytes on the model cache's disk, and the cache's budget (0: none): the agent evicts the least
    # recently used snapshots no endpoint serves from once a download takes the cache past it.
    disk_free_bytes: int = field(default=0, metadata=since(MODEL_CACHE_SINCE))
    cache_budget_bytes: int = field(default=0, metadata=since(MODEL_CACHE_SINCE))

    @property
    def blank(self) -> bool:
        """Nothing but GPUs: no container, model, endpoint or problem (what an agent process sends before it
        has looked, in its first Hello): it says nothing about what the node runs or lacks."""
        return not (self.containers or self.models or self.endpoints or self.problems)

"""Command results: the `data` of a `Result` frame, one dataclass per command type, `parse_result` and
`build_result`.

A field left None was not reported and is not sent (`result_to_dict` drops it), so each result keeps the
JSON shape its handler always had; fields every handler reports have plain defaults.

Version skew: what an agent reports is read leniently by the control plane (`parse_result`): unknown fields
(from a newer agent) are ignored, missing ones (from an older agent) read as their defaults, and a field
whose value does not fit its type reads as absent, so a result never fails the command it answers. The
raw `data` is stored as it came (`Command.result`); receivers read the typed result. The agent's handlers
return these types (its runner fails a command whose handler returned anything else, `agent.runner.result_data`);
`build_result` checks a dict strictly against its type.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from agent.protocol.validation import from_dict
from agent.protocol.versions import ProtocolError

Number = int | float  # kept as sent: an int stays an int


@dataclass(frozen=True)
class ContainerResult:
    """container.create / start / stop / destroy: the container (a Deployment in kubernetes modes)."""

    container_id: str = ""
    name: str | None = None
    status: str | None = None  # created | running | exited | stopped | missing
    ports: dict[str, int] | None = None  # docker: container port → host port
    namespace: str | None = None  # kubernetes
    commit: str | None = None  # argocd: the Git commit of the change
    existed: bool | None = None  # create: the command's container was there already


@dataclass(frozen=True)
class ModelDownloadResult:
    """model.download: the snapshot in the node's cache."""

    model_id: str = ""
    revision: str = ""
    commit: str = ""
    path: str = ""
    size_bytes: int = 0
    files: int = 0
    # Snapshots the cache budget evicted after it (`model@revision`, least recently used first).
    evicted: list[str] | None = None


@dataclass(frozen=True)
class ModelEvictResult:
    """model.evict: what left the cache (`freed_bytes` 0 and `evicted` False: it was not there)."""

    model_id: str = ""
    revision: str = ""
    evicted: bool = False
    freed_bytes: int = 0


@dataclass(frozen=True)
class StartPhases:
    """How a replica's start went on its node, each phase's end in seconds after the agent took the command:
    its weights (`weights`: present in the cache, or downloaded: `weights_bytes` in `weights_s`), its server
    process spawned, the model loaded into it (vLLM logged its weights loaded; else when it answered) and the
    first health check passed (GET /v1/models lists the model), then its adapters loaded."""

    weights: str = ""  # present | downloaded
    weights_bytes: int = 0
    weights_s: Number = 0.0
    server_started_s: Number = 0.0
    model_loaded_s: Number = 0.0
    healthy_s: Number = 0.0
    adapters_s: Number | None = None  # when the start's LoRA adapters were loaded (None: it had none)


@dataclass(frozen=True)
class EndpointStartResult:
    """endpoint.start: where the server answers (an already running one answers without `log_tail` and
    `phases`)."""

    endpoint_id: str = ""
    port: int = 0
    pid: int = 0
    device: str = ""
    log_tail: str | None = None  # the server's start-up lines
    phases: StartPhases | None = None  # a server started by this command: how its start went
    adapters: list[str] | None = None  # the LoRA adapters it has loaded (None: LoRA is off)


@dataclass(frozen=True)
class EndpointAdapterResult:
    """endpoint.adapter.load / unload: the adapter's state on the server now, and the server's adapters."""

    endpoint_id: str = ""
    name: str = ""
    status: str = ""  # loaded | unloaded
    seconds: Number = 0.0  # fetching (when its weights were missing) and loading, or unloading
    adapters: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class EndpointStopResult:
    """endpoint.stop (stopping an unknown endpoint reports no pid)."""

    endpoint_id: str = ""
    status: str = "stopped"
    pid: int | None = None


@dataclass(frozen=True)
class RayNodeStartResult:
    """ray.head.start / ray.worker.start: the Ray node (a worker's node id comes later, from ray.status)."""

    container_id: str = ""  # the Ray container, or the RayCluster's name (kuberay); "" for processes
    ray_node_id: str = ""
    ip: str = ""
    hostname: str = ""  # kuberay: the head Service's host
    gcs_address: str | None = None
    gcs_port: int | None = None  # a head's GCS port (the one the agent picked when it was asked for none)
    dashboard_url: str | None = None
    dashboard_port: int | None = None  # kuberay
    pid: int | None = None  # process runtime
    already_running: bool | None = None
    existed: bool | None = None  # kuberay: the RayCluster was there already
    resumed: bool | None = None  # kuberay: a suspended RayCluster was resumed
    commit: str | None = None  # kuberay in argocd mode


@dataclass(frozen=True)
class RayNodeDrainResult:
    """ray.node.drain: Ray accepted the drain (a refusal is an error)."""

    accepted: bool = False


@dataclass(frozen=True)
class RayNodeStopResult:
    """ray.node.stop."""

    stopped: bool = False
    reason: str | None = None  # why nothing was stopped
    joined: bool | None = None  # a stop already running for this member was joined (its outcome answered)
    container_id: str | None = None
    suspended: bool | None = None  # kuberay
    deleted: bool | None = None  # kuberay
    commit: str | None = None  # kuberay in argocd mode


@dataclass(frozen=True)
class RayStatusNode:
    """One Ray node of a `ray.status` result."""

    ray_node_id: str = ""
    member_id: str = ""  # "" for nodes the fleet did not start
    is_head: bool = False
    alive: bool = True
    status: str = ""
    idle_s: float = 0.0
    resources: dict[str, Any] = field(default_factory=dict)
    available: dict[str, Any] = field(default_factory=dict)
    ip: str = ""
    name: str | None = None  # kuberay
    # per-node usage, when the agent measures it (else the fleet node's own heartbeat figures apply)
    cpu_percent: Number | None = None
    memory_percent: Number | None = None
    gpu_count: int | None = None
    vram_used_mb: int | None = None
    vram_total_mb: int | None = None
    running_tasks: int | None = None


@dataclass(frozen=True)
class RayKubeStatus:
    """KubeRay's view of a RayCluster, in a kuberay `ray.status` result."""

    name: str = ""
    state: str = ""
    suspended: bool = False
    ready_workers: int = 0
    desired_workers: int = 0
    min_workers: int = 0
    max_workers: int = 0
    head_host: str = ""
    ray_api_error: str | None = None


@dataclass(frozen=True)
class RayStatusResult:
    """ray.status: Ray nodes, pending demand and, when asked, log tails (kuberay: the RayCluster's state)."""

    nodes: list[RayStatusNode] = field(default_factory=list)
    pending: list[Any] = field(default_factory=list)
    head_free: dict[str, Any] = field(default_factory=dict)
    placement_groups: list[Any] = field(default_factory=list)
    truncated: bool = False
    kuberay: RayKubeStatus | None = None
    logs: dict[str, str] | None = None


@dataclass(frozen=True)
class RayJobSubmitResult:
    """ray.job.submit."""

    submission_id: str = ""
    status: str = ""
    already_submitted: bool = False


@dataclass(frozen=True)
class RayJobStatusResult:
    """ray.job.status: Ray's state, the log tail, the traceback of a failure and the result markers."""

    submission_id: str = ""
    status: str = ""  # PENDING | RUNNING | SUCCEEDED | FAILED | STOPPED
    message: str = ""
    logs: str = ""
    traceback: str = ""
    markers: list[dict[str, Any]] = field(default_factory=list)  # "CTFLEET " lines: the job's own JSON
    start_time: Number | None = None
    end_time: Number | None = None


@dataclass(frozen=True)
class RayJobStopResult:
    """ray.job.stop."""

    submission_id: str = ""
    stopped: bool = False


@dataclass(frozen=True)
class RayServeStatusResult:
    """ray.serve.status: Serve applications (deployments, replicas, replica log tails) as Ray reports them."""

    applications: dict[str, dict[str, Any]] = field(default_factory=dict)
    http_port: int | None = None
    http_host: str | None = None
    missing: bool = False


@dataclass(frozen=True)
class AgentUpdateResult:
    """agent.update: the version now running (or already running: `unchanged`)."""

    version: str = ""
    previous_version: str | None = None
    seconds: Number | None = None  # from the update's start until the new version connected
    unchanged: bool | None = None


RESULT_TYPES: dict[str, type] = {
    "container.create": ContainerResult,
    "container.start": ContainerResult,
    "container.stop": ContainerResult,
    "container.destroy": ContainerResult,
    "model.download": ModelDownloadResult,
    "model.evict": ModelEvictResult,
    "endpoint.start": EndpointStartResult,
    "endpoint.stop": EndpointStopResult,
    "endpoint.adapter.load": EndpointAdapterResult,
    "endpoint.adapter.unload": EndpointAdapterResult,
    "ray.head.start": RayNodeStartResult,
    "ray.worker.start": RayNodeStartResult,
    "ray.node.drain": RayNodeDrainResult,
    "ray.node.stop": RayNodeStopResult,
    "ray.status": RayStatusResult,
    "ray.job.submit": RayJobSubmitResult,
    "ray.job.status": RayJobStatusResult,
    "ray.job.stop": RayJobStopResult,
    "ray.serve.status": RayServeStatusResult,
    "agent.update": AgentUpdateResult,
}


def parse_result(command_type: str, data: Any) -> Any:
    """The typed result of a `command_type` command from the `data` an agent reported, read leniently
    (never raises; see the module docstring). None for a command type without a result type."""
    cls = RESULT_TYPES.get(command_type)
    if cls is None:
        return None
    if not isinstance(data, dict):
        return cls()
    return from_dict(cls, data, where=f"{command_type} result", lenient=True)


def build_result(command_type: str, data: dict[str, Any]) -> Any:
    """The typed result of `data` checked strictly (unknown or ill-typed fields: `ProtocolError`)."""
    try:
        cls = RESULT_TYPES[command_type]
    except KeyError:
        raise ProtocolError(f"no result type for command type {command_type!r}") from None
    return from_dict(cls, data, where=f"{command_type} result")


def result_to_dict(result: Any) -> Any:
    """A result as the `data` of its `Result` frame: its fields, those left None not sent."""
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        return {
            f.name: result_to_dict(value)
            for f in dataclasses.fields(result)
            if (value := getattr(result, f.name)) is not None
        }
    if isinstance(result, list | tuple):
        return [result_to_dict(item) for item in result]
    if isinstance(result, dict):
        return {key: result_to_dict(value) for key, value in result.items()}
    return result

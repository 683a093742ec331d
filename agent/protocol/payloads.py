"""Command payloads: the `payload` of a `Command` frame, one dataclass per command type, and `parse_payload`.

Each payload is defined once, here: its fields' bounds and patterns are `agent.protocol.rules` metadata,
enforced by `parse_payload` on the agent and turned into the control plane's API validation and OpenAPI
schema (`fleet.payload_schema.serializer_for`). Also the agent self-update's payload and the message the
control plane's CA signs for an agent package.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from agent.protocol.endpoint_rules import ENDPOINT_AGENT_ARGS, endpoint_arg_reserved  # noqa: F401 (re-exported)
from agent.protocol.rules import (
    ADAPTER_MODEL_ID_RE,
    ADAPTER_NAME_RE,
    ADAPTER_PATH_RE,
    AGENT_VERSION_RE,
    ENDPOINT_ID_RE,
    FILE_NAME_RE,
    HEAD_ADDRESS_RE,
    HOST_RE,
    KUBE_NAME_RE,
    LOCAL_PATH_RE,
    MAX_ITEMS,
    MODEL_ID_RE,
    NAME_RE,
    RAY_NODE_ID_RE,
    RAY_VERSION_RE,
    REVISION_RE,
    SHA256_HEX_RE,
    rule,
)
from agent.protocol.validation import from_dict, nesting_exceeds
from agent.protocol.versions import MAX_NESTING, ProtocolError

# The command types, each named once here, by the part of each side that carries them out: the control plane's
# `fleet.models.CommandType`, the API's payload serializers, the payload and result types below and the agent's
# handlers all follow these lists (tests/project/test_command_types.py holds them to it).
WorkloadCommandType = Literal[  # fleet.workloads; the agent's executor, model cache and endpoint servers
    "container.create",
    "container.start",
    "container.stop",
    "container.destroy",
    "model.download",
    "model.evict",
    "endpoint.start",
    "endpoint.stop",
    "endpoint.adapter.load",
    "endpoint.adapter.unload",
]
RayNodeCommandType = Literal[  # raymgr; the agent's Ray backends
    "ray.head.start",
    "ray.worker.start",
    "ray.node.drain",
    "ray.node.stop",
    "ray.status",
]
RayJobCommandType = Literal[  # raymgr.workloads; the agent's Ray job client (on a head's node)
    "ray.job.submit",
    "ray.job.status",
    "ray.job.stop",
    "ray.serve.status",
]
AgentCommandType = Literal["agent.update"]  # the control plane's own (fleet.agent_updates); the agent's updater
CommandType = Literal[WorkloadCommandType, RayNodeCommandType, RayJobCommandType, AgentCommandType]
COMMAND_TYPES: tuple[str, ...] = get_args(CommandType)
WORKLOAD_COMMAND_TYPES: tuple[str, ...] = get_args(WorkloadCommandType)
RAY_NODE_COMMAND_TYPES: tuple[str, ...] = get_args(RayNodeCommandType)
RAY_JOB_COMMAND_TYPES: tuple[str, ...] = get_args(RayJobCommandType)
AGENT_COMMAND_TYPES: tuple[str, ...] = get_args(AgentCommandType)


# A payload field added after its command type: the control plane leaves it out of the payload while it holds
# its default (`fleet.payloads.validate_payload`), so an agent that predates the field reads the command as before.
SENT_WHEN_SET = {"sent_when_set": True}
MODEL_ID = rule(max_length=200, pattern=MODEL_ID_RE, message="Not a valid model id (expected owner/name).")
MAX_MEMORY_MB = 16 * 1024 * 1024  # 16 TiB: a container's memory limit, an endpoint's VRAM per replica
REVISION = rule(max_length=200, pattern=REVISION_RE)


@dataclass(frozen=True)
class PortMapping:
    """A container port published on the host (host_port 0 = pick any free port)."""

    container_port: int = field(metadata=rule(min=1, max=65535))
    host_port: int = field(default=0, metadata=rule(min=0, max=65535))
    protocol: Literal["tcp", "udp"] = "tcp"


@dataclass(frozen=True)
class ContainerCreatePayload:
    """container.create: run `image` as `name` with resource requests."""

    image: str = field(metadata=rule(max_length=500))
    name: str = field(metadata=rule(max_length=128, pattern=NAME_RE, message="Use letters, digits, _ . -"))
    command: list[str] = field(default_factory=list, metadata=rule(items_max=MAX_ITEMS, item_max_length=1000))
    env: dict[str, str] = field(default_factory=dict, metadata=rule(item_max_length=4000))
    ports: list[PortMapping] = field(default_factory=list, metadata=rule(items_max=MAX_ITEMS))
    cpu: float = field(default=0.0, metadata=rule(min=0, max=1024))  # cores; 0 = no limit
    memory_mb: int = field(default=0, metadata=rule(min=0, max=MAX_MEMORY_MB))  # 0 = no limit
    gpus: int = field(default=0, metadata=rule(min=0, max=64))
    labels: dict[str, str] = field(default_factory=dict, metadata=rule(item_max_length=4000))
    # when set (kubernetes mode), an Ingress routes this host to the first port
    endpoint_host: str = field(default="", metadata=rule(max_length=253))
    registry_username: str = field(default="", metadata=rule(max_length=200))
    registry_password: str = field(default="", metadata=rule(max_length=2000))
    start: bool = True


@dataclass(frozen=True)
class ContainerRefPayload:
    """container.start / container.stop / container.destroy: which container, by id or name."""

    container: str = field(metadata=rule(max_length=255))
    timeout_s: int = field(default=10, metadata=rule(min=0, max=3600))  # graceful stop timeout before SIGKILL


@dataclass(frozen=True)
class ModelDownloadPayload:
    """model.download: snapshot a Hub repository into the node cache."""

    model_id: str = field(metadata=MODEL_ID)
    revision: str = field(default="main", metadata=REVISION)
    allow_patterns: list[str] = field(default_factory=list, metadata=rule(items_max=MAX_ITEMS, item_max_length=200))
    # The node's model cache budget (0: none): once the download is in, the agent evicts the least recently
    # used snapshots no endpoint serves from until the cache fits it (set by the control plane from the node).
    cache_budget_bytes: int = field(default=0, metadata=rule(min=0, max=2**62))
    # A folder already on the node (a private model of the catalog): registered in the cache under `model_id`
    # (a link, nothing copied or downloaded) so endpoints serve it like a Hub snapshot. Operators only.
    local_path: str = field(
        default="",
        metadata=rule(max_length=1000, pattern=LOCAL_PATH_RE, message="An absolute folder path on the node."),
    )


@dataclass(frozen=True)
class ModelEvictPayload:
    """model.evict: remove a snapshot from the node's cache (refused while an endpoint serves from it)."""

    model_id: str = field(metadata=MODEL_ID)
    revision: str = field(default="main", metadata=REVISION)


ADAPTER_NAME = rule(
    max_length=64,
    pattern=ADAPTER_NAME_RE,
    message="An adapter name is 1-64 letters, digits and _ . - (it is the `model` a request names).",
)


@dataclass(frozen=True)
class LoraAdapterRef:
    """A LoRA adapter an endpoint's server loads: `name` is what requests put in `model`; its weights are a Hub
    repository (`model_id`@`revision`, fetched into the node's model cache when missing) or, when `path` is set,
    an absolute directory on the node."""

    name: str = field(metadata=ADAPTER_NAME)
    model_id: str = field(default="", metadata=rule(max_length=200, pattern=ADAPTER_MODEL_ID_RE))
    revision: str = field(default="main", metadata=REVISION)
    path: str = field(default="", metadata=rule(max_length=1000, pattern=ADAPTER_PATH_RE))


@dataclass(frozen=True)
class EndpointGroup:
    """One rank's place in a multi-node endpoint (`agent.workloads.distributed`): vLLM split into
    `pipeline_parallel` stages across `nnodes` nodes, `tensor_parallel` GPUs within each. The leader
    (node_rank 0) serves the OpenAI API; a follower runs vLLM headless and joins the leader's
    torch.distributed group at `master_addr`:`master_port`. `backend` "mp" is vLLM's own multi-node
    executor (each node runs its rank: CPU and GPU); "ray" is vLLM's Ray executor, started on the leader
    only (Ray places the other ranks), which vLLM supports on GPU platforms only. The default is one node."""

    pipeline_parallel: int = field(default=1, metadata=rule(min=1, max=64))
    tensor_parallel: int = field(default=1, metadata=rule(min=1, max=64))
    nnodes: int = field(default=1, metadata=rule(min=1, max=64))
    node_rank: int = field(default=0, metadata=rule(min=0, max=63))
    master_addr: str = field(default="", metadata=rule(max_length=253, pattern=HOST_RE))
    master_port: int = field(default=0, metadata=rule(min=0, max=65535))
    role: Literal["leader", "follower"] = "leader"
    backend: Literal["mp", "ray"] = "mp"
    # the Ray node's container on this node to run the rank inside (docker runtime: the rank lives and dies
    # with that Ray node); empty: a process of the agent's own. Sent only when set (older agents ignore it).
    container: str = field(default="", metadata={**rule(max_length=128, pattern=NAME_RE), **SENT_WHEN_SET})

    @property
    def distributed(self) -> bool:
        """Whether this endpoint spans more than one process group of vLLM (PP > 1 or several nodes)."""
        return self.nnodes > 1 or self.pipeline_parallel > 1 or self.backend == "ray"

    def problems(self) -> list[str]:
        """What is inconsistent in the group (empty when it can start); the same rules on both sides."""
        found = []
        if self.node_rank >= self.nnodes:
            found.append(f"node_rank {self.node_rank} is not below nnodes {self.nnodes}.")
        if (self.role == "leader") != (self.node_rank == 0):
            found.append("The leader is node_rank 0 and every other rank is a follower.")
        if self.backend == "mp" and self.nnodes > 1 and (not self.master_addr or not self.master_port):
            found.append("A group of several nodes needs master_addr and master_port (the leader's).")
        if self.backend == "ray" and self.role != "leader":
            found.append("With the Ray executor only the leader is started (Ray places the other ranks).")
        if self.backend == "mp" and self.nnodes > self.pipeline_parallel * self.tensor_parallel:
            found.append("More nodes than ranks: nnodes must not exceed pipeline_parallel x tensor_parallel.")
        return found


@dataclass(frozen=True)
class EndpointStartPayload:
    """endpoint.start: serve a cached model with an OpenAI-compatible server. The API makes `endpoint_id` up
    when left out (a new endpoint); the same id restarts a stopped one."""

    endpoint_id: str = field(
        metadata=rule(
            pattern=ENDPOINT_ID_RE,
            message="An endpoint id is 12 hex digits (leave it out to start a new endpoint).",
        )
    )
    model_id: str = field(metadata=MODEL_ID)
    revision: str = field(default="main", metadata=REVISION)
    port: int = field(default=0, metadata=rule(min=0, max=65535))  # 0 = pick a free port
    gpus: int = field(default=0, metadata=rule(min=0, max=64))
    min_vram_mb: int = field(default=0, metadata=rule(min=0, max=MAX_MEMORY_MB))
    extra_args: list[str] = field(default_factory=list, metadata=rule(items_max=MAX_ITEMS, item_max_length=500))
    # LoRA adapters to load once the server answers (the server then starts with `--enable-lora`); more are
    # loaded and unloaded while it runs by endpoint.adapter.load / endpoint.adapter.unload. Both fields below
    # are sent only when set, so an agent that predates them reads every payload it did before.
    adapters: list[LoraAdapterRef] = field(
        default_factory=list, metadata={**rule(items_max=MAX_ITEMS), **SENT_WHEN_SET}
    )
    # the weights missing from this node's cache: fetch them first (a cold start) instead of failing
    download: bool = field(default=False, metadata=SENT_WHEN_SET)
    # one node unless it names a group (each of its fields bounded by its own rule); sent only when it names one
    # (agents before it refuse the field)
    group: EndpointGroup = field(default_factory=EndpointGroup, metadata={**rule(), **SENT_WHEN_SET})


@dataclass(frozen=True)
class EndpointStopPayload:
    """endpoint.stop."""

    endpoint_id: str = field(metadata=rule(max_length=100, pattern=NAME_RE))


@dataclass(frozen=True)
class EndpointAdapterLoadPayload:
    """endpoint.adapter.load: load a LoRA adapter into a running server without a restart (vLLM's
    /v1/load_lora_adapter); loading one already loaded answers loaded again."""

    endpoint_id: str = field(metadata=rule(pattern=ENDPOINT_ID_RE))
    adapter: LoraAdapterRef = field(metadata=rule())  # bounded by its own fields


@dataclass(frozen=True)
class EndpointAdapterUnloadPayload:
    """endpoint.adapter.unload: unload a LoRA adapter from a running server (vLLM's /v1/unload_lora_adapter);
    one not loaded answers unloaded."""

    endpoint_id: str = field(metadata=rule(pattern=ENDPOINT_ID_RE))
    name: str = field(metadata=ADAPTER_NAME)


# ---- managed Ray (ray.*): `runtime` "docker" runs rayproject/ray containers, "process" runs `ray start`
# on the host (tests, single machines without Docker). `member_id` names one Ray node of a managed
# cluster (the control plane's RayNode id) and is used for container names and the node's Ray label.


RUNTIME = Literal["docker", "process", "kuberay"]
ID = rule(max_length=100, pattern=NAME_RE)  # a cluster, member or submission id
PORT = rule(min=1, max=65535)
CPUS = rule(min=0, max=1024)
GPUS = rule(min=0, max=64)
IMAGE = rule(max_length=500)
RAY_VERSION = rule(max_length=32, pattern=RAY_VERSION_RE)
HOST = rule(max_length=253, pattern=HOST_RE)  # kuberay: the head Service's host (else 127.0.0.1 on the node)
RAY_GCS_PORT = 6379  # Ray's default GCS port: a KubeRay head's (its pod's own network), drain/status's default


@dataclass(frozen=True)
class RayHeadStartPayload:
    """ray.head.start: start the head of managed Ray cluster `cluster_id` on this node."""

    cluster_id: str = field(metadata=ID)
    member_id: str = field(metadata=ID)
    ray_version: str = field(metadata=RAY_VERSION)
    image: str = field(metadata=IMAGE)
    runtime: RUNTIME = "docker"
    # 0 = the agent picks a free port on its machine (reported back as the result's gcs_port)
    gcs_port: int = field(default=0, metadata=rule(min=0, max=65535))
    dashboard_port: int = field(default=8265, metadata=PORT)
    num_cpus: float = field(default=0.0, metadata=CPUS)  # 0 = what Ray detects
    num_gpus: int = field(default=0, metadata=GPUS)
    # kuberay only: the RayCluster's name and its worker group (KubeRay's autoscaler sizes it).
    name: str = field(default="", metadata=rule(max_length=50, pattern=KUBE_NAME_RE))
    min_workers: int = field(default=0, metadata=rule(min=0, max=1000))
    max_workers: int = field(default=0, metadata=rule(min=0, max=1000))
    idle_timeout_s: int = field(default=60, metadata=rule(min=0, max=86400))
    worker_cpus: float = field(default=0.0, metadata=CPUS)
    worker_memory_mb: int = field(default=0, metadata=rule(min=0, max=4 * 1024 * 1024))
    worker_gpus: int = field(default=0, metadata=GPUS)
    worker_image: str = field(default="", metadata=IMAGE)


@dataclass(frozen=True)
class RayWorkerStartPayload:
    """ray.worker.start: start a worker joining the head at `head_address` (ip:gcs_port)."""

    cluster_id: str = field(metadata=ID)
    member_id: str = field(metadata=ID)
    ray_version: str = field(metadata=RAY_VERSION)
    image: str = field(metadata=IMAGE)
    head_address: str = field(metadata=rule(max_length=300, pattern=HEAD_ADDRESS_RE))
    runtime: RUNTIME = "docker"
    num_cpus: float = field(default=0.0, metadata=CPUS)
    num_gpus: int = field(default=0, metadata=GPUS)


@dataclass(frozen=True)
class RayNodeDrainPayload:
    """ray.node.drain (sent to the head's node): ask Ray to drain worker `ray_node_id` before it stops."""

    cluster_id: str = field(metadata=ID)
    member_id: str = field(metadata=ID)  # the worker being drained
    ray_node_id: str = field(metadata=rule(max_length=128, pattern=RAY_NODE_ID_RE))
    runtime: RUNTIME = "docker"
    head_member_id: str = field(default="", metadata=ID)
    gcs_port: int = field(default=RAY_GCS_PORT, metadata=PORT)
    reason: str = field(default="idle", metadata=rule(max_length=200, blank=True))
    deadline_s: int = field(default=60, metadata=rule(min=0, max=3600))


@dataclass(frozen=True)
class RayNodeStopPayload:
    """ray.node.stop: stop (and remove) one Ray node of a managed cluster on this node."""

    cluster_id: str = field(metadata=ID)
    member_id: str = field(metadata=ID)
    runtime: RUNTIME = "docker"
    container: str = field(default="", metadata=rule(max_length=255))
    timeout_s: int = field(default=30, metadata=rule(min=0, max=3600))
    delete: bool = False  # kuberay: delete the RayCluster (otherwise it is suspended)


@dataclass(frozen=True)
class RayStatusPayload:
    """ray.status (sent to the head's node): nodes, usage, pending demand and, optionally, log tails."""

    cluster_id: str = field(metadata=ID)
    member_id: str = field(metadata=ID)  # the head
    runtime: RUNTIME = "docker"
    gcs_port: int = field(default=RAY_GCS_PORT, metadata=PORT)
    include_logs: bool = False
    log_lines: int = field(default=200, metadata=rule(min=0, max=2000))


# ---- Ray workloads (ray.job.*, ray.serve.*), all sent to the head's node and run against the head's
# dashboard (Job API / Serve REST API) at 127.0.0.1:`dashboard_port`. Training jobs, Tune experiments and
# Serve deploys are Ray jobs; `files` become the job's working_dir; the job's stdout carries result
# markers (lines starting with "CTFLEET ") that `ray.job.status` parses.


@dataclass(frozen=True)
class RayJobSubmitPayload:
    """ray.job.submit: submit Ray job `submission_id` (idempotent: an existing submission is reported)."""

    cluster_id: str = field(metadata=ID)
    member_id: str = field(metadata=ID)  # the head
    submission_id: str = field(metadata=ID)
    entrypoint: str = field(metadata=rule(max_length=4000))
    runtime: RUNTIME = "docker"
    dashboard_port: int = field(default=8265, metadata=PORT)
    host: str = field(default="", metadata=HOST)
    files: dict[str, str] = field(
        default_factory=dict,
        metadata=rule(item_max_length=200_000, key_pattern=FILE_NAME_RE, message="Bad file name(s)", strip=False),
    )
    runtime_env: dict[str, Any] = field(default_factory=dict)
    entrypoint_num_cpus: float = field(default=0.0, metadata=CPUS)
    entrypoint_num_gpus: float = field(default=0.0, metadata=rule(min=0, max=64))
    metadata: dict[str, str] = field(default_factory=dict, metadata=rule(item_max_length=500))


@dataclass(frozen=True)
class RayJobRefPayload:
    """ray.job.status (state, log tail, traceback, result markers) / ray.job.stop of one Ray job."""

    cluster_id: str = field(metadata=ID)
    member_id: str = field(metadata=ID)
    submission_id: str = field(metadata=ID)
    runtime: RUNTIME = "docker"
    dashboard_port: int = field(default=8265, metadata=PORT)
    log_lines: int = field(default=200, metadata=rule(min=0, max=5000))
    host: str = field(default="", metadata=HOST)


@dataclass(frozen=True)
class RayServeStatusPayload:
    """ray.serve.status: Serve applications, deployments, replica states and replica log tails."""

    cluster_id: str = field(metadata=ID)
    member_id: str = field(metadata=ID)
    runtime: RUNTIME = "docker"
    dashboard_port: int = field(default=8265, metadata=PORT)
    app_name: str = field(default="", metadata=rule(max_length=100))
    log_lines: int = field(default=50, metadata=rule(min=0, max=2000))
    host: str = field(default="", metadata=HOST)


# ---- agent self-update (protocol 2 on)

# What the control plane's CA key signs for an agent package: a context string (starting with "C", so
# never a DER structure this key also signs), the version, a NUL, and the package's SHA-256 in hex.
AGENT_PACKAGE_CONTEXT = b"CleverThis agent package v1\x00"


def agent_package_message(version: str, sha256: str) -> bytes:
    """The bytes the CA signs for package `version` with digest `sha256` (ProtocolError if malformed)."""
    if not re.fullmatch(AGENT_VERSION_RE, version) or version in {".", ".."}:
        raise ProtocolError("an agent version is 1-100 characters of letters, digits and . + _ -")
    if not re.fullmatch(SHA256_HEX_RE, sha256):
        raise ProtocolError("a package digest is 64 lower-case hex characters (SHA-256)")
    return AGENT_PACKAGE_CONTEXT + version.encode("ascii") + b"\x00" + sha256.encode("ascii")


@dataclass(frozen=True)
class AgentUpdatePayload:
    """agent.update: download the package at `path` from the control plane, check its digest against the
    CA's `signature_b64` over `agent_package_message(version, sha256)`, install it beside the running
    version, switch over and restart; roll back unless the new version connects within `rollback_after_s`."""

    version: str  # checked by `agent_package_message` when the package is verified
    sha256: str
    signature_b64: str
    path: str = "/agent/package.tar.gz"
    rollback_after_s: float = 120.0


PAYLOAD_TYPES: dict[str, type] = {
    "container.create": ContainerCreatePayload,
    "container.start": ContainerRefPayload,
    "container.stop": ContainerRefPayload,
    "container.destroy": ContainerRefPayload,
    "model.download": ModelDownloadPayload,
    "model.evict": ModelEvictPayload,
    "endpoint.start": EndpointStartPayload,
    "endpoint.stop": EndpointStopPayload,
    "endpoint.adapter.load": EndpointAdapterLoadPayload,
    "endpoint.adapter.unload": EndpointAdapterUnloadPayload,
    "ray.head.start": RayHeadStartPayload,
    "ray.worker.start": RayWorkerStartPayload,
    "ray.node.drain": RayNodeDrainPayload,
    "ray.node.stop": RayNodeStopPayload,
    "ray.status": RayStatusPayload,
    "ray.job.submit": RayJobSubmitPayload,
    "ray.job.status": RayJobRefPayload,
    "ray.job.stop": RayJobRefPayload,
    "ray.serve.status": RayServeStatusPayload,
    "agent.update": AgentUpdatePayload,
}


def parse_payload(command_type: str, payload: dict[str, Any]) -> Any:
    """Validate `payload` for `command_type` and return its dataclass; `ProtocolError` if invalid."""
    try:
        cls = PAYLOAD_TYPES[command_type]
    except KeyError:
        raise ProtocolError(f"unknown command type {command_type!r}") from None
    if nesting_exceeds(payload, MAX_NESTING - 1):  # the payload sits one level inside its Command frame
        raise ProtocolError(f"{command_type} payload is nested deeper than {MAX_NESTING - 1} levels")
    return from_dict(cls, payload, where=f"{command_type} payload")


def read_payload(command_type: str, payload: Any) -> Any:
    """A payload as it was stored (validated when it was sent) read back as its dataclass, leniently: fields
    it does not know (`secret_fields`) are left out and a value that does not fit reads as its default. None
    for an unknown command type or a payload without its required fields."""
    cls = PAYLOAD_TYPES.get(command_type)
    if cls is None or not isinstance(payload, dict):
        return None
    try:
        return from_dict(cls, payload, where=f"{command_type} payload", lenient=True)
    except ProtocolError:
        return None

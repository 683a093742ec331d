"""Command payloads: the `payload` of a `Command` frame, one dataclass per command type, and `parse_payload`.

Also the agent self-update's payload and the message the control plane's CA signs for an agent package.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from agent.protocol.validation import from_dict, nesting_exceeds
from agent.protocol.versions import MAX_NESTING, ProtocolError

CommandType = Literal[
    "container.create",
    "container.start",
    "container.stop",
    "container.destroy",
    "model.download",
    "endpoint.start",
    "endpoint.stop",
    "ray.head.start",
    "ray.worker.start",
    "ray.node.drain",
    "ray.node.stop",
    "ray.status",
    "ray.job.submit",
    "ray.job.status",
    "ray.job.stop",
    "ray.serve.status",
    "agent.update",
]
COMMAND_TYPES: tuple[str, ...] = get_args(CommandType)


@dataclass(frozen=True)
class PortMapping:
    """A container port published on the host (host_port 0 = pick any free port)."""

    container_port: int
    host_port: int = 0
    protocol: Literal["tcp", "udp"] = "tcp"


@dataclass(frozen=True)
class ContainerCreatePayload:
    """container.create: run `image` as `name` with resource requests."""

    image: str
    name: str
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    ports: list[PortMapping] = field(default_factory=list)
    cpu: float = 0.0  # cores; 0 = no limit
    memory_mb: int = 0  # 0 = no limit
    gpus: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    endpoint_host: str = ""  # when set (kubernetes mode), an Ingress routes this host to the first port
    registry_username: str = ""
    registry_password: str = ""
    start: bool = True


@dataclass(frozen=True)
class ContainerRefPayload:
    """container.start / container.stop / container.destroy: which container, by id or name."""

    container: str
    timeout_s: int = 10  # graceful stop timeout before SIGKILL


@dataclass(frozen=True)
class ModelDownloadPayload:
    """model.download: snapshot a Hub repository into the node cache."""

    model_id: str
    revision: str = "main"
    allow_patterns: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class EndpointStartPayload:
    """endpoint.start: serve a cached model with an OpenAI-compatible server."""

    endpoint_id: str
    model_id: str
    revision: str = "main"
    port: int = 0  # 0 = pick a free port
    gpus: int = 0
    min_vram_mb: int = 0
    extra_args: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class EndpointStopPayload:
    """endpoint.stop."""

    endpoint_id: str


# ---- managed Ray (ray.*): `runtime` "docker" runs rayproject/ray containers, "process" runs `ray start`
# on the host (tests, single machines without Docker). `member_id` names one Ray node of a managed
# cluster (the control plane's RayNode id) and is used for container names and the node's Ray label.


@dataclass(frozen=True)
class RayHeadStartPayload:
    """ray.head.start: start the head of managed Ray cluster `cluster_id` on this node."""

    cluster_id: str
    member_id: str
    ray_version: str
    image: str
    runtime: Literal["docker", "process", "kuberay"] = "docker"
    gcs_port: int = 0  # 0 = the agent picks a free port on its machine (reported back as gcs_port)
    dashboard_port: int = 8265
    num_cpus: float = 0.0  # 0 = what Ray detects
    num_gpus: int = 0
    # kuberay only: the RayCluster's name and its worker group (KubeRay's autoscaler sizes it).
    name: str = ""
    min_workers: int = 0
    max_workers: int = 0
    idle_timeout_s: int = 60
    worker_cpus: float = 0.0
    worker_memory_mb: int = 0
    worker_gpus: int = 0
    worker_image: str = ""


@dataclass(frozen=True)
class RayWorkerStartPayload:
    """ray.worker.start: start a worker joining the head at `head_address` (ip:gcs_port)."""

    cluster_id: str
    member_id: str
    ray_version: str
    image: str
    head_address: str
    runtime: Literal["docker", "process", "kuberay"] = "docker"
    num_cpus: float = 0.0
    num_gpus: int = 0


@dataclass(frozen=True)
class RayNodeDrainPayload:
    """ray.node.drain (sent to the head's node): ask Ray to drain worker `ray_node_id` before it stops."""

    cluster_id: str
    member_id: str  # the worker being drained
    ray_node_id: str
    runtime: Literal["docker", "process", "kuberay"] = "docker"
    head_member_id: str = ""
    gcs_port: int = 6379
    reason: str = "idle"
    deadline_s: int = 60


@dataclass(frozen=True)
class RayNodeStopPayload:
    """ray.node.stop: stop (and remove) one Ray node of a managed cluster on this node."""

    cluster_id: str
    member_id: str
    runtime: Literal["docker", "process", "kuberay"] = "docker"
    container: str = ""
    timeout_s: int = 30
    delete: bool = False  # kuberay: delete the RayCluster (otherwise it is suspended)


@dataclass(frozen=True)
class RayStatusPayload:
    """ray.status (sent to the head's node): nodes, usage, pending demand and, optionally, log tails."""

    cluster_id: str
    member_id: str  # the head
    runtime: Literal["docker", "process", "kuberay"] = "docker"
    gcs_port: int = 6379
    include_logs: bool = False
    log_lines: int = 200


# ---- Ray workloads (ray.job.*, ray.serve.*), all sent to the head's node and run against the head's
# dashboard (Job API / Serve REST API) at 127.0.0.1:`dashboard_port`. Training jobs, Tune experiments and
# Serve deploys are Ray jobs; `files` become the job's working_dir; the job's stdout carries result
# markers (lines starting with "CTFLEET ") that `ray.job.status` parses.


@dataclass(frozen=True)
class RayJobSubmitPayload:
    """ray.job.submit: submit Ray job `submission_id` (idempotent: an existing submission is reported)."""

    cluster_id: str
    member_id: str  # the head
    submission_id: str
    entrypoint: str
    runtime: Literal["docker", "process", "kuberay"] = "docker"
    dashboard_port: int = 8265
    host: str = ""  # kuberay: the head Service's host (else 127.0.0.1 on the head's node)
    files: dict[str, str] = field(default_factory=dict)
    runtime_env: dict[str, Any] = field(default_factory=dict)
    entrypoint_num_cpus: float = 0.0
    entrypoint_num_gpus: float = 0.0
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RayJobRefPayload:
    """ray.job.status (state, log tail, traceback, result markers) / ray.job.stop of one Ray job."""

    cluster_id: str
    member_id: str
    submission_id: str
    runtime: Literal["docker", "process", "kuberay"] = "docker"
    dashboard_port: int = 8265
    log_lines: int = 200
    host: str = ""


@dataclass(frozen=True)
class RayServeStatusPayload:
    """ray.serve.status: Serve applications, deployments, replica states and replica log tails."""

    cluster_id: str
    member_id: str
    runtime: Literal["docker", "process", "kuberay"] = "docker"
    dashboard_port: int = 8265
    app_name: str = ""
    log_lines: int = 50
    host: str = ""


# ---- agent self-update (protocol 2 on)

# What the control plane's CA key signs for an agent package: a context string (starting with "C", so
# never a DER structure this key also signs), the version, a NUL, and the package's SHA-256 in hex.
AGENT_PACKAGE_CONTEXT = b"CleverThis agent package v1\x00"
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_AGENT_VERSION = re.compile(r"[A-Za-z0-9.+_-]{1,100}")


def agent_package_message(version: str, sha256: str) -> bytes:
    """The bytes the CA signs for package `version` with digest `sha256` (ProtocolError if malformed)."""
    if not _AGENT_VERSION.fullmatch(version) or version in {".", ".."}:
        raise ProtocolError("an agent version is 1-100 characters of letters, digits and . + _ -")
    if not _SHA256_HEX.fullmatch(sha256):
        raise ProtocolError("a package digest is 64 lower-case hex characters (SHA-256)")
    return AGENT_PACKAGE_CONTEXT + version.encode("ascii") + b"\x00" + sha256.encode("ascii")


@dataclass(frozen=True)
class AgentUpdatePayload:
    """agent.update: download the package at `path` from the control plane, check its digest against the
    CA's `signature_b64` over `agent_package_message(version, sha256)`, install it beside the running
    version, switch over and restart; roll back unless the new version connects within `rollback_after_s`."""

    version: str
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
    "endpoint.start": EndpointStartPayload,
    "endpoint.stop": EndpointStopPayload,
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

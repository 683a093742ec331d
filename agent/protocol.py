"""The wire protocol between the compute agent and the control plane.

One module, imported by both sides (the agent never imports Django; the control plane imports this
file). Every frame is a JSON object ``{"v": PROTOCOL_VERSION, "type": ..., "id": ..., ...}`` sent as
one WebSocket text message. Each frame type is a frozen dataclass; `encode` turns one into text and
`decode` parses and validates text back into the right dataclass, raising `ProtocolError` (with a
reason fit to send back in a close frame) for anything malformed.

Control frames (hello, heartbeat, command, ack, progress, result, error, backoff, revoked) are small;
bulk bytes (proxied HTTP bodies) travel in `StreamData` frames on numbered streams with credit-based
flow control (`StreamWindow`), so a sender can always put a control frame ahead of queued bulk data.
From protocol 3 on, a sender may coalesce the data of several streams that is ready at the same moment
into one `StreamBatch` message (streaming inference: one small chunk per token on hundreds of streams),
so the peer parses one WebSocket message for many chunks instead of one each.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import types
import typing
import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

# The newest protocol version this build speaks, and the oldest it still speaks, so a control plane
# and agents a version or two apart keep working during a rolling deploy. The agent states its
# range in the connect URL (`?protocol=<min>-<max>`; an agent without it speaks 1) and in its `Hello`;
# the control plane answers at the highest version both speak, and every frame carries that version.
# A field added in version N is declared with `field(..., metadata=since(N))`: it is left out of frames
# encoded for an older version (whose decoder would refuse an unknown field).
PROTOCOL_VERSION = 3
MIN_PROTOCOL_VERSION = 1
# `StreamBatch` (several streams' data in one message) exists from this version on; an older peer gets
# one `StreamData` message per chunk.
STREAM_BATCH_SINCE = 3
# Frames larger than this are refused by both sides (proxied bodies are chunked well below it).
MAX_FRAME_BYTES = 1024 * 1024 + 64
# Objects and lists nested deeper than this are refused by both sides (the protocol's own structures
# are under ten levels deep), so nothing that handles a decoded frame (`from_dict`, `to_dict`,
# json.dumps, the database) ever recurses deeply; JSON nested past the interpreter's recursion limit
# (json.loads raises RecursionError) is refused the same way.
MAX_NESTING = 32
# Default flow-control window per proxied stream (bytes the receiver lets the sender have in flight).
# It also bounds the stream bytes queued in the tunnel's TCP buffers ahead of a heartbeat or command:
# at 4 MiB a bulk transfer added ~20 ms to heartbeat round trips, at 1 MiB ~3 ms, at the same MB/s.
DEFAULT_STREAM_WINDOW = 1024 * 1024
# A sender coalesces ready stream chunks into one `StreamBatch` up to about this many bytes (a larger
# chunk goes out alone as `StreamData`): well under MAX_FRAME_BYTES, and no longer to put on the wire
# ahead of a control frame than one bulk chunk.
STREAM_BATCH_MAX_BYTES = 256 * 1024
HEARTBEAT_INTERVAL_S = 30.0
# Agent → control plane WebSocket path.
TUNNEL_PATH = "/agent/tunnel"

# Close codes of the tunnel; the close frame also carries a reason (`cleverthis.daphne_fixes`).
CLOSE_PROTOCOL_ERROR = 4400  # a malformed, oversized or unacceptable frame (or agent_nonce)
CLOSE_UNAUTHORIZED = 4401  # no hello, or a hello that does not authenticate
CLOSE_REVOKED = 4403  # this node's certificate is revoked: never reconnect
CLOSE_BACKOFF = 4429  # reconnect later (a `Backoff` frame before the close says when)
CLOSE_STALE = 4408  # the node was marked lost while this socket stayed open: reconnect and say hello again
CLOSE_AGENT_TOO_OLD = 4426  # the agent's protocol is older than the control plane accepts: re-run the installer
CLOSE_MEANINGS: dict[int, str] = {
    1000: "normal closure",
    1001: "going away",
    1002: "WebSocket protocol error",
    1007: "invalid payload",
    1009: "message too big",
    1011: "server error",
    CLOSE_PROTOCOL_ERROR: "bad frame",
    CLOSE_UNAUTHORIZED: "not authenticated",
    CLOSE_REVOKED: "revoked",
    CLOSE_BACKOFF: "back off",
    CLOSE_STALE: "stale tunnel",
    CLOSE_AGENT_TOO_OLD: "agent too old",
}

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

# Machine-readable failure codes carried by `Error` frames and recorded on commands.
ErrorCode = Literal[
    "invalid_payload",
    "unknown_command",
    "unsupported",
    "not_found",
    "conflict",
    "docker_unavailable",
    "image_pull_failed",
    "registry_auth_failed",
    "kubernetes_unavailable",
    "gitops_failed",
    "argocd_sync_failed",
    "kuberay_missing",
    "hub_unreachable",
    "model_not_found",
    "weights_missing",
    "insufficient_vram",
    "insufficient_memory",
    "internal",
]
ERROR_CODES: tuple[str, ...] = get_args(ErrorCode)


class ProtocolError(ValueError):
    """A frame that cannot be accepted; `str(err)` is a reason safe to send to the peer."""


def since(version: int) -> dict[str, int]:
    """Field metadata: this field exists from protocol `version` on (left out of older frames)."""
    return {"since": version}


def parse_version_range(text: str) -> tuple[int, int] | None:
    """`"1-2"` (or `"2"`) → (1, 2); None when malformed. An agent's `?protocol=` connect parameter."""
    match = re.fullmatch(r"([0-9]{1,4})(?:-([0-9]{1,4}))?", text or "")
    if match is None:
        return None
    low = int(match.group(1))
    high = int(match.group(2) or low)
    return (low, high) if low <= high else None


def negotiate(ours: tuple[int, int], theirs: tuple[int, int]) -> int | None:
    """The highest version both ranges hold, or None when they do not overlap."""
    best = min(ours[1], theirs[1])
    return best if best >= max(ours[0], theirs[0]) else None


def new_id() -> str:
    """A fresh frame/command id."""
    return uuid.uuid4().hex


# --------------------------------------------------------------------------------------------------
# Shared value types


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


@dataclass(frozen=True)
class EndpointInfo:
    """A running inference endpoint on the node."""

    endpoint_id: str
    model_id: str
    port: int
    status: str  # starting | running | stopped | failed
    pid: int = 0
    container_id: str = ""


@dataclass(frozen=True)
class Inventory:
    """Everything the agent runs and holds, sent on every (re)connect for reconciliation."""

    containers: list[ContainerInfo] = field(default_factory=list)
    endpoints: list[EndpointInfo] = field(default_factory=list)
    models: list[CachedModel] = field(default_factory=list)
    gpus: list[GpuInfo] = field(default_factory=list)
    completed_command_keys: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------------
# Command payloads (the `payload` of a `Command` frame, by command type)


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
    gcs_port: int = 6379
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


# --------------------------------------------------------------------------------------------------
# Frames


@dataclass(frozen=True, kw_only=True)
class Frame:
    """Base of every frame: version, type tag and id."""

    TYPE: ClassVar[str] = ""
    v: int = PROTOCOL_VERSION
    id: str = field(default_factory=new_id)


# ---- authentication (control plane speaks first after the socket opens)
#
# Each side proves its key over the other side's nonce. The keys involved also sign other things (the
# CA key signs node certificates, a node key signed its CSR), so a proof is never a signature over the
# bare nonce: it covers a fixed context string followed by the nonce, one context per direction, and
# nonces are 16-128 URL-safe characters. The signed bytes then start with "C" (0x43), while everything
# else these keys sign (a DER TBSCertificate, CertificationRequestInfo or TBSCertList) starts with 0x30
# (SEQUENCE): a proof can never be a certificate's, CSR's or CRL's signature, whatever nonce is chosen.

SERVER_PROOF_CONTEXT = b"CleverThis tunnel server proof v1\x00"
AGENT_PROOF_CONTEXT = b"CleverThis tunnel agent proof v1\x00"
_NONCE = re.compile(r"[A-Za-z0-9_-]{16,128}")


def is_valid_nonce(nonce: str) -> bool:
    """True for a nonce either side may be asked to sign: 16-128 URL-safe base64/hex characters."""
    return _NONCE.fullmatch(nonce) is not None


def _proof_message(context: bytes, nonce: str) -> bytes:
    if not is_valid_nonce(nonce):
        raise ProtocolError("a tunnel nonce must be 16-128 URL-safe characters")
    return context + nonce.encode("ascii")


def server_proof_message(agent_nonce: str) -> bytes:
    """What the control plane signs with its CA key over the agent's `?agent_nonce=` (ProtocolError if malformed)."""
    return _proof_message(SERVER_PROOF_CONTEXT, agent_nonce)


def agent_proof_message(nonce: str) -> bytes:
    """What the agent signs with its node key over the `Challenge` nonce (ProtocolError if malformed)."""
    return _proof_message(AGENT_PROOF_CONTEXT, nonce)


@dataclass(frozen=True, kw_only=True)
class Challenge(Frame):
    """CP → agent: sign `agent_proof_message(nonce)` with the node key to prove possession of the certificate."""

    TYPE: ClassVar[str] = "challenge"
    nonce: str
    # The control plane's CA signature over `server_proof_message(agent_nonce)`, the nonce the agent sent
    # in the connect URL (`?agent_nonce=`): the agent checks it against its pinned CA certificate.
    server_signature_b64: str = ""


@dataclass(frozen=True, kw_only=True)
class Hello(Frame):
    """Agent → CP: certificate, signature over `agent_proof_message(nonce)`, host facts and full inventory."""

    TYPE: ClassVar[str] = "hello"
    node_id: str
    certificate_pem: str
    signature_b64: str
    facts: HostFacts
    inventory: Inventory = field(default_factory=Inventory)
    # The protocol versions this agent speaks (from version 2 on; an older agent speaks only 1).
    protocol_min: int = field(default=MIN_PROTOCOL_VERSION, metadata=since(2))
    protocol_max: int = field(default=PROTOCOL_VERSION, metadata=since(2))


@dataclass(frozen=True, kw_only=True)
class Welcome(Frame):
    """CP → agent: authenticated; heartbeat at `heartbeat_interval_s`."""

    TYPE: ClassVar[str] = "welcome"
    node_id: str
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    # The node's cluster orchestration mode (standalone | kubernetes | argocd) and that mode's settings
    # (for argocd: server, token, repo_url, branch, app_name). Secrets travel only here, over TLS.
    mode: str = "standalone"
    mode_settings: dict[str, Any] = field(default_factory=dict)
    # The agent version the control plane serves, and whether this agent should update to it.
    agent_version_current: str = field(default="", metadata=since(2))
    update_required: bool = field(default=False, metadata=since(2))


# ---- liveness


@dataclass(frozen=True, kw_only=True)
class Heartbeat(Frame):
    """Agent → CP every `heartbeat_interval_s`: current utilization."""

    TYPE: ClassVar[str] = "heartbeat"
    cpu_percent: float
    memory_percent: float
    memory_used_mb: int = 0
    memory_total_mb: int = 0
    gpus: list[GpuInfo] = field(default_factory=list)
    containers_running: int = 0
    sent_at: float = 0.0  # agent's time.time(), for latency measurement


@dataclass(frozen=True, kw_only=True)
class HeartbeatAck(Frame):
    """CP → agent: heartbeat `heartbeat_id` recorded."""

    TYPE: ClassVar[str] = "heartbeat_ack"
    heartbeat_id: str


@dataclass(frozen=True, kw_only=True)
class Backoff(Frame):
    """CP → agent: disconnect and do not retry for `retry_after_s` (deploys, overload)."""

    TYPE: ClassVar[str] = "backoff"
    retry_after_s: float
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class Revoked(Frame):
    """CP → agent: this node's certificate is revoked; stop reconnecting."""

    TYPE: ClassVar[str] = "revoked"
    reason: str = "node deleted"


# ---- commands


@dataclass(frozen=True, kw_only=True)
class Command(Frame):
    """CP → agent: run `command_type` with `payload`; `idempotency_key` makes re-delivery safe."""

    TYPE: ClassVar[str] = "command"
    command_id: str
    idempotency_key: str
    command_type: str
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Ack(Frame):
    """Agent → CP: command received and started (or already done: `duplicate`)."""

    TYPE: ClassVar[str] = "ack"
    command_id: str
    duplicate: bool = False


@dataclass(frozen=True, kw_only=True)
class Progress(Frame):
    """Agent → CP: a step of a running command (image pull layers, download bytes, drain steps)."""

    TYPE: ClassVar[str] = "progress"
    command_id: str
    message: str
    percent: float | None = None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Result(Frame):
    """Agent → CP: command succeeded with `data` (container id, endpoint port, model path...)."""

    TYPE: ClassVar[str] = "result"
    command_id: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Error(Frame):
    """Agent → CP: command failed with a machine-readable `code` and a human `message`."""

    TYPE: ClassVar[str] = "error"
    command_id: str
    code: str
    message: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class InventoryReport(Frame):
    """Agent → CP: inventory changed (after a download, container exit...)."""

    TYPE: ClassVar[str] = "inventory"
    inventory: Inventory


# ---- proxied streams (control plane opens byte streams towards a port on the node)


@dataclass(frozen=True, kw_only=True)
class StreamOpen(Frame):
    """CP → agent: open stream `stream_id` as a TCP connection to 127.0.0.1:`port` on the node.

    With `host` set (a KubeRay head's in-cluster Service), the agent dials `host`:`port` instead, if it
    manages a Ray head there.

    A stream is a byte pipe: the control plane writes the HTTP/1.1 request (or WebSocket upgrade) and
    reads the raw response, so chunked bodies, SSE and upgraded sockets pass through unchanged.
    `window` is the credit the control plane grants the agent for response bytes.
    """

    TYPE: ClassVar[str] = "stream_open"
    stream_id: int
    port: int
    window: int = DEFAULT_STREAM_WINDOW
    host: str = ""


@dataclass(frozen=True, kw_only=True)
class StreamData(Frame):
    """Either direction: body bytes of stream `stream_id`; counts against the peer's window.

    Sent as a binary WebSocket message (`encode` returns bytes): a 10-byte header — magic 0xCD, the
    protocol version, the stream id as unsigned 64-bit big-endian — then the raw bytes. No JSON, no
    base64, so bulk data costs little CPU on either side.
    """

    TYPE: ClassVar[str] = "stream_data"
    id: str = ""  # bulk frames carry no id (none is needed, and none is sent)
    stream_id: int
    data: bytes = b""

    @classmethod
    def of(cls, stream_id: int, data: bytes) -> StreamData:
        return cls(stream_id=stream_id, data=bytes(data))

    def payload(self) -> bytes:
        return self.data


@dataclass(frozen=True, kw_only=True)
class StreamBatch(Frame):
    """Either direction, protocol 3 on: the data of several streams in one binary message.

    `chunks` are (stream id, bytes) in the order they were sent; each counts against its own stream's
    window exactly as the same bytes in a `StreamData` would, and a receiver delivers them in that order
    (so the chunks of one stream stay in order, within a batch and across batches). Binary layout: magic
    0xCE, the protocol version, then per chunk the stream id (unsigned 64-bit big-endian), the length
    (unsigned 32-bit big-endian) and the bytes; at least one chunk, nothing after the last.
    """

    TYPE: ClassVar[str] = "stream_batch"
    id: str = ""  # like StreamData: no id
    chunks: list[tuple[int, bytes]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class StreamWindow(Frame):
    """Either direction: grant the peer `increment` more bytes of credit on stream `stream_id`."""

    TYPE: ClassVar[str] = "stream_window"
    stream_id: int
    increment: int


@dataclass(frozen=True, kw_only=True)
class StreamEnd(Frame):
    """Either direction: stream `stream_id` is finished (`error` set when it broke)."""

    TYPE: ClassVar[str] = "stream_end"
    stream_id: int
    error: str = ""


FRAME_TYPES: dict[str, type[Frame]] = {
    cls.TYPE: cls
    for cls in (
        Challenge,
        Hello,
        Welcome,
        Heartbeat,
        HeartbeatAck,
        Backoff,
        Revoked,
        Command,
        Ack,
        Progress,
        Result,
        Error,
        InventoryReport,
        StreamOpen,
        StreamData,
        StreamBatch,
        StreamWindow,
        StreamEnd,
    )
}
CONTROL_FRAME_TYPES = frozenset(FRAME_TYPES) - {"stream_data", "stream_batch"}


# --------------------------------------------------------------------------------------------------
# Encoding and validation

T = TypeVar("T")
F = TypeVar("F", bound="Frame")


def to_dict(obj: Any, version: int = PROTOCOL_VERSION) -> Any:
    """A dataclass (or nested structure of them) as plain JSON-able data, as protocol `version` has it."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        data = {
            f.name: to_dict(getattr(obj, f.name), version)
            for f in dataclasses.fields(obj)
            if f.metadata.get("since", 0) <= version
        }
        if isinstance(obj, Frame):
            data["type"] = obj.TYPE
        return data
    if isinstance(obj, list | tuple):
        return [to_dict(item, version) for item in obj]
    if isinstance(obj, dict):
        return {key: to_dict(value, version) for key, value in obj.items()}
    return obj


BINARY_MAGIC = 0xCD
BATCH_MAGIC = 0xCE
_BINARY_HEADER = struct.Struct("!BBQ")
_BATCH_HEADER = struct.Struct("!BB")
_BATCH_CHUNK = struct.Struct("!QI")
BATCH_CHUNK_OVERHEAD = _BATCH_CHUNK.size  # bytes a chunk adds to a batch besides its data


def encode(frame: Frame) -> str | bytes:
    """Serialize `frame` at its version `frame.v`: JSON text for control frames, binary for `StreamData`.

    Fields newer than `frame.v` are left out, so a frame made at version 1 reads as version 1 did.
    """
    if isinstance(frame, StreamData):
        return _BINARY_HEADER.pack(BINARY_MAGIC, frame.v, frame.stream_id) + frame.data
    if isinstance(frame, StreamBatch):
        return encode_batch(frame.chunks, frame.v)
    return json.dumps(to_dict(frame, frame.v), separators=(",", ":"))


def encode_batch(chunks: list[tuple[int, bytes]], version: int = PROTOCOL_VERSION) -> bytes:
    """The binary `StreamBatch` message of `chunks` at `version` (ProtocolError below STREAM_BATCH_SINCE)."""
    if version < STREAM_BATCH_SINCE:
        raise ProtocolError(f"stream batches need protocol {STREAM_BATCH_SINCE} (this tunnel speaks {version})")
    if not chunks:
        raise ProtocolError("a stream batch holds at least one chunk")
    parts = [_BATCH_HEADER.pack(BATCH_MAGIC, version)]
    pack = _BATCH_CHUNK.pack
    for stream_id, data in chunks:
        parts.append(pack(stream_id, len(data)))
        parts.append(data)
    return b"".join(parts)


def at_version(frame: F, version: int) -> F:
    """`frame` to be sent at protocol `version` (the session's)."""
    return frame if frame.v == version else dataclasses.replace(frame, v=version)


def _check_version(version: Any) -> None:
    if (
        isinstance(version, bool)
        or not isinstance(version, int)
        or not (MIN_PROTOCOL_VERSION <= version <= PROTOCOL_VERSION)
    ):
        raise ProtocolError(
            f"unsupported protocol version {version!r} (this side speaks {MIN_PROTOCOL_VERSION}-{PROTOCOL_VERSION})"
        )


def _decode_binary(raw: bytes) -> StreamData | StreamBatch:
    if raw[:1] == bytes([BATCH_MAGIC]):
        return _decode_batch(raw)
    if len(raw) < _BINARY_HEADER.size:
        raise ProtocolError("binary frame shorter than its header")
    magic, version, stream_id = _BINARY_HEADER.unpack_from(raw)
    if magic != BINARY_MAGIC:
        raise ProtocolError("binary frames must be stream data (bad magic byte)")
    _check_version(version)
    return StreamData(stream_id=stream_id, data=raw[_BINARY_HEADER.size :], id="", v=version)


def _decode_batch(raw: bytes) -> StreamBatch:
    if len(raw) < _BATCH_HEADER.size:
        raise ProtocolError("stream batch shorter than its header")
    _, version = _BATCH_HEADER.unpack_from(raw)
    _check_version(version)
    if version < STREAM_BATCH_SINCE:
        raise ProtocolError(f"stream batches need protocol {STREAM_BATCH_SINCE} (the frame says {version})")
    chunks: list[tuple[int, bytes]] = []
    offset, end = _BATCH_HEADER.size, len(raw)
    unpack = _BATCH_CHUNK.unpack_from
    while offset < end:
        if end - offset < _BATCH_CHUNK.size:
            raise ProtocolError("stream batch cut inside a chunk header")
        stream_id, length = unpack(raw, offset)
        offset += _BATCH_CHUNK.size
        if length > end - offset:
            raise ProtocolError("stream batch chunk runs past the end of the frame")
        chunks.append((stream_id, raw[offset : offset + length]))
        offset += length
    if not chunks:
        raise ProtocolError("a stream batch holds at least one chunk")
    return StreamBatch(chunks=chunks, v=version)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def decode(raw: str | bytes) -> Frame:
    """Parse and validate one frame; raise `ProtocolError` with a reason on anything malformed.

    Text messages are JSON control frames; binary messages are `StreamData` or `StreamBatch`.
    """
    if len(raw) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(raw)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    if isinstance(raw, bytes | bytearray | memoryview):
        return _decode_binary(bytes(raw))
    try:
        data = json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"frame is not valid JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError(f"frame is nested deeper than {MAX_NESTING} levels") from None
    if not isinstance(data, dict):
        raise ProtocolError("frame must be a JSON object")
    if nesting_exceeds(data, MAX_NESTING):
        raise ProtocolError(f"frame is nested deeper than {MAX_NESTING} levels")
    version = data.get("v")
    _check_version(version)
    frame_type = data.get("type")
    cls = FRAME_TYPES.get(frame_type) if isinstance(frame_type, str) else None
    if cls is StreamData or cls is StreamBatch:
        raise ProtocolError("stream data must be sent as a binary message")
    if cls is None:
        raise ProtocolError(f"unknown frame type {frame_type!r}")
    body = {key: value for key, value in data.items() if key != "type"}
    return from_dict(cls, body, where=f"{frame_type} frame")


def nesting_exceeds(value: Any, limit: int) -> bool:
    """True when `value` has objects/lists nested more than `limit` deep (itself counts as 1).

    Iterative, so it cannot itself hit the recursion limit, and it stops at the first path too deep.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def from_dict(cls: type[T], data: Any, *, where: str) -> T:
    """Build dataclass `cls` from `data`, checking every field's type; `ProtocolError` otherwise."""
    if not isinstance(data, dict):
        raise ProtocolError(f"{where} must be an object")
    hints = _hints(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = set(data) - set(known)
    if unknown:
        raise ProtocolError(f"{where} has unknown field(s): {', '.join(sorted(unknown))}")
    kwargs: dict[str, Any] = {}
    for name, fld in known.items():
        if name in data:
            kwargs[name] = _coerce(hints[name], data[name], where=f"{where}.{name}")
        elif fld.default is dataclasses.MISSING and fld.default_factory is dataclasses.MISSING:
            raise ProtocolError(f"{where} is missing required field {name!r}")
    return cls(**kwargs)


_HINT_CACHE: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINT_CACHE:
        _HINT_CACHE[cls] = get_type_hints(cls)
    return _HINT_CACHE[cls]


def _coerce(hint: Any, value: Any, *, where: str) -> Any:
    origin = get_origin(hint)
    if origin is Literal:
        if value not in get_args(hint):
            raise ProtocolError(f"{where} must be one of {', '.join(map(repr, get_args(hint)))}")
        return value
    if origin in (Union, types.UnionType):
        options = get_args(hint)
        if value is None and type(None) in options:
            return None
        last_error: ProtocolError | None = None
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(option, value, where=where)
            except ProtocolError as exc:
                last_error = exc
        raise last_error or ProtocolError(f"{where} has the wrong type")
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError(f"{where} must be a list")
        (item_hint,) = get_args(hint) or (Any,)
        return [_coerce(item_hint, item, where=f"{where}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where} must be an object")
        key_hint, value_hint = get_args(hint) or (str, Any)
        return {
            _coerce(key_hint, k, where=f"{where} key"): _coerce(value_hint, v, where=f"{where}[{k!r}]")
            for k, v in value.items()
        }
    if hint is Any or hint is typing.Any:
        return value
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, where=where)
    if hint is bool:
        if not isinstance(value, bool):
            raise ProtocolError(f"{where} must be a boolean")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"{where} must be an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProtocolError(f"{where} must be a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ProtocolError(f"{where} must be a string")
        return value
    raise ProtocolError(f"{where}: unsupported field type {hint!r}")  # pragma: no cover - programming error

"""Every frame of the tunnel: `Frame` (version, type tag, id) and one frozen dataclass per frame type.

Field types matter at run time: `agent.protocol.codec` validates decoded frames against these annotations.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, ClassVar

from agent.protocol.values import GpuInfo, HostFacts, Inventory
from agent.protocol.versions import (
    DEFAULT_STREAM_WINDOW,
    HEARTBEAT_INTERVAL_S,
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    since,
)


def new_id() -> str:
    """A fresh frame/command id."""
    return uuid.uuid4().hex


@dataclass(frozen=True, kw_only=True)
class Frame:
    """Base of every frame: version, type tag and id."""

    TYPE: ClassVar[str] = ""
    v: int = PROTOCOL_VERSION
    id: str = field(default_factory=new_id)


# ---- authentication (control plane speaks first after the socket opens; see `agent.protocol.proofs`)


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
class Move(Frame):
    """CP → agent (protocol 6 on): the replica holding this tunnel is draining. Open a new tunnel (same
    URL, through the load balancer: it lands on another replica) at a random moment within `within_s`
    seconds, and keep this one (its streams, its commands) until the new one is welcomed; the control
    plane then sends new work over the new one and closes this one once its streams ended."""

    TYPE: ClassVar[str] = "move"
    within_s: float = 0.0
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


# The frames of one stream that a `StreamFrames` message can carry.
StreamFrame = StreamOpen | StreamData | StreamWindow | StreamEnd


@dataclass(frozen=True, kw_only=True)
class StreamFrames(Frame):
    """Either direction, protocol 5 on: the opens, data, window increments and ends of several streams in
    one binary message (hundreds of requests opening at once cost one message, not three each).

    `frames` are delivered in the order they were queued, exactly as if each had come as a message of its
    own (so a stream's open comes before its data, and its end after them); the entries carry no id and
    the message's version. Binary layout (`agent.protocol.stream_frames`): magic 0xCF, the protocol
    version, then per entry its kind (1 open, 2 data, 3 window, 4 end), the stream id (unsigned 64-bit
    big-endian), the body's length (unsigned 32-bit big-endian) and the body: for an open the port
    (unsigned 16-bit), the window (unsigned 32-bit) and the host (UTF-8, the rest of the body); for data
    the bytes; for a window the increment (unsigned 32-bit); for an end the error (UTF-8, empty for a
    normal end). At least one entry, nothing after the last.
    """

    TYPE: ClassVar[str] = "stream_frames"
    id: str = ""  # like StreamData: no id
    frames: list[StreamFrame] = field(default_factory=list)


FRAME_TYPES: dict[str, type[Frame]] = {
    cls.TYPE: cls
    for cls in (
        Challenge,
        Hello,
        Welcome,
        Heartbeat,
        HeartbeatAck,
        Backoff,
        Move,
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
        StreamFrames,
    )
}
CONTROL_FRAME_TYPES = frozenset(FRAME_TYPES) - {"stream_data", "stream_batch", "stream_frames"}

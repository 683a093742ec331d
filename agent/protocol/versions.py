"""Protocol versions and their negotiation, the protocol's limits, close codes, error codes, `ProtocolError`.

The bottom of `agent.protocol`: imports nothing of it.
"""

from __future__ import annotations

import re
from typing import Literal, get_args

# The newest protocol version this build speaks, and the oldest it still speaks, so a control plane
# and agents a version or two apart keep working during a rolling deploy. The agent states its
# range in the connect URL (`?protocol=<min>-<max>`; an agent without it speaks 1) and in its `Hello`;
# the control plane answers at the highest version both speak, and every frame carries that version.
# A field added in version N is declared with `field(..., metadata=since(N))`: it is left out of frames
# encoded for an older version (whose decoder would refuse an unknown field).
PROTOCOL_VERSION = 7
MIN_PROTOCOL_VERSION = 1
# `StreamBatch` (several streams' data in one message) exists from this version on; an older peer gets
# one `StreamData` message per chunk.
STREAM_BATCH_SINCE = 3
# `Inventory.problems` (what the agent could not read, e.g. no Kubernetes credentials) exists from this
# version on.
INVENTORY_PROBLEMS_SINCE = 4
# `StreamFrames` (the opens, data, window increments and ends of several streams in one message) exists
# from this version on; an older peer gets each of those frames as a message of its own.
STREAM_FRAMES_SINCE = 5
# `Move` (the control plane's replica is draining: open a new tunnel, keep this one until the new one is
# welcomed) exists from this version on; an older agent's tunnel is closed once its streams ended and it
# reconnects as before.
MOVE_SINCE = 6
# The model cache's bookkeeping in the inventory (`CachedModel.last_used_at`, `Inventory.disk_free_bytes` and
# `cache_budget_bytes`) exists from this version on; an older agent's inventory reads as before (no figures).
MODEL_CACHE_SINCE = 7
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

# An agent told to back off (a `Backoff` frame) waits `retry_after_s` stretched by up to this fraction, at
# random (a refused crowd does not come back in step); the control plane sizes its Backoffs with it.
BACKOFF_JITTER = 0.2

# Close codes of the tunnel; the close frame also carries a reason (`cleverthis.daphne_fixes`, `uvicorn_fixes`).
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
    1003: "unsupported data",
    1006: "connection lost",
    1008: "policy violation",
    1010: "extension required",
    1011: "server error",
    1012: "service restart",
    1013: "try again later",
    1014: "bad gateway",
    CLOSE_PROTOCOL_ERROR: "bad frame",
    CLOSE_UNAUTHORIZED: "not authenticated",
    CLOSE_REVOKED: "revoked",
    CLOSE_BACKOFF: "back off",
    CLOSE_STALE: "stale tunnel",
    CLOSE_AGENT_TOO_OLD: "agent too old",
}

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
    "lora_disabled",
    "adapter_missing",
    "adapter_failed",
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

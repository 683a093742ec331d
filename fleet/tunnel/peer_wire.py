"""The peer link's wire: what two control-plane processes say to each other about proxied streams.

One schema, imported by both ends: the process holding a node's tunnel (`fleet.tunnel.peer_listener`)
and the process proxying a request to that node (`fleet.proxy.peer_dialer`).

A frame is a 13-byte header (kind, stream id, payload length, network order) and its payload. Stream
ids are the ids the agent sees (`TunnelStream` picks them at random, 52 bits); 0 is the link itself.

Handshake, before anything else (both sides prove they know the key derived from SECRET_KEY):
  dialer   → HELLO      version byte + the dialer's nonce
  listener → CHALLENGE  the listener's nonce + HMAC(key, "listener" | dialer nonce | listener nonce)
  dialer   → PROOF      HMAC(key, "dialer" | listener nonce | dialer nonce)
then streams: OPEN (node, port, host, window, end flag, first request bytes) answered by OPENED or
NOT_HERE (the tunnel is not held there: ask the database again), and DATA, WINDOW (credit), END
(an error text, or none for a request that is complete) either way.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from django.conf import settings

VERSION = 1

HELLO, CHALLENGE, PROOF, OPEN, OPENED, NOT_HERE, DATA, WINDOW, END = range(1, 10)
KINDS = frozenset(range(1, 10))

HEADER = struct.Struct("!BQI")  # kind, stream id, payload length
_OPEN = struct.Struct("!16sHIBH")  # node id, port, window, end flag, host length; then host, data
_INCREMENT = struct.Struct("!Q")
NONCE_BYTES = 16
PROOF_BYTES = 32
# The largest payload a reader takes; DATA is sent in pieces of at most DATA_MAX, an OPEN carries at
# most 64 KiB of first bytes.
MAX_PAYLOAD = 1024 * 1024
DATA_MAX = 256 * 1024
# Until the dialer proved it holds the key, the listener takes no payload larger than the handshake's own
# (HELLO 17 bytes, PROOF 32): an unauthenticated connection holds a few dozen bytes, never a megabyte.
PRE_AUTH_MAX_PAYLOAD = 64


class PeerProtocolError(Exception):
    """A frame the peer should never have sent: the link is dropped."""


def frame(kind: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One whole frame."""
    return HEADER.pack(kind, stream_id, len(payload)) + payload


def header(kind: int, stream_id: int, size: int) -> bytes:
    """A frame's header alone, for a payload written after it without being copied into one bytes."""
    return HEADER.pack(kind, stream_id, size)


@dataclass(frozen=True, slots=True)
class Opening:
    """What an OPEN carries: where the stream goes and how it starts."""

    node_id: str
    port: int
    host: str
    window: int
    data: bytes
    end: bool

    def message(self) -> dict[str, object]:
        """The opening as the tunnel consumer takes it (`open_local_stream`)."""
        return {"port": self.port, "host": self.host, "window": self.window, "data": self.data, "end": self.end}


def open_frame(stream_id: int, opening: Opening) -> bytes:
    host = opening.host.encode()
    node = uuid.UUID(str(opening.node_id)).bytes
    head = _OPEN.pack(node, opening.port, opening.window, int(opening.end), len(host))
    return frame(OPEN, stream_id, head + host + opening.data)


def parse_open(payload: bytes) -> Opening:
    if len(payload) < _OPEN.size:
        raise PeerProtocolError("short OPEN")
    node, port, window, end, host_size = _OPEN.unpack_from(payload)
    host_end = _OPEN.size + host_size
    if len(payload) < host_end:
        raise PeerProtocolError("OPEN host cut short")
    host = payload[_OPEN.size : host_end].decode(errors="replace")
    return Opening(str(uuid.UUID(bytes=node)), port, host, window, payload[host_end:], bool(end))


def window_frame(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW, stream_id, _INCREMENT.pack(increment))


def parse_window(payload: bytes) -> int:
    if len(payload) != _INCREMENT.size:
        raise PeerProtocolError("bad WINDOW")
    return _INCREMENT.unpack(payload)[0]


def end_frame(stream_id: int, error: str = "") -> bytes:
    return frame(END, stream_id, error.encode())


# ---- the handshake


def link_key() -> bytes:
    """The key both ends prove they hold: derived from SECRET_KEY, used for nothing else."""
    return hmac.new(settings.SECRET_KEY.encode(), b"cleverthis tunnel peer link", hashlib.sha256).digest()


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def hello_frame(dialer_nonce: bytes) -> bytes:
    return frame(HELLO, 0, bytes([VERSION]) + dialer_nonce)


def parse_hello(payload: bytes) -> bytes:
    """The dialer's nonce; a `PeerProtocolError` for another version or a malformed hello."""
    if len(payload) != 1 + NONCE_BYTES:
        raise PeerProtocolError("malformed HELLO")
    if payload[0] != VERSION:
        raise PeerProtocolError(f"peer link version {payload[0]}, this process speaks {VERSION}")
    return payload[1:]


def _proof(key: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(key, role + first + second, hashlib.sha256).digest()


def challenge_frame(key: bytes, dialer_nonce: bytes, listener_nonce: bytes) -> bytes:
    return frame(CHALLENGE, 0, listener_nonce + _proof(key, b"listener", dialer_nonce, listener_nonce))


def check_challenge(key: bytes, dialer_nonce: bytes, payload: bytes) -> bytes:
    """The listener's nonce, once its proof checks; a `PeerProtocolError` otherwise."""
    listener_nonce, proof = payload[:NONCE_BYTES], payload[NONCE_BYTES:]
    expected = _proof(key, b"listener", dialer_nonce, listener_nonce)
    if len(listener_nonce) != NONCE_BYTES or not hmac.compare_digest(proof, expected):
        raise PeerProtocolError("the listener could not prove it holds the peer key (another SECRET_KEY?)")
    return listener_nonce


def proof_frame(key: bytes, dialer_nonce: bytes, listener_nonce: bytes) -> bytes:
    return frame(PROOF, 0, _proof(key, b"dialer", listener_nonce, dialer_nonce))


def check_proof(key: bytes, dialer_nonce: bytes, listener_nonce: bytes, payload: bytes) -> None:
    if not hmac.compare_digest(payload, _proof(key, b"dialer", listener_nonce, dialer_nonce)):
        raise PeerProtocolError("the dialer could not prove it holds the peer key (another SECRET_KEY?)")


# ---- reading


class FrameReader:
    """Cuts the bytes of a link into frames, whatever pieces they arrive in; a frame announcing a payload over
    `max_payload` is refused at its header (before any of it is buffered)."""

    def __init__(self, max_payload: int = MAX_PAYLOAD) -> None:
        self._buffer = bytearray()
        self.max_payload = max_payload

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        """The frames completed by `data`: (kind, stream id, payload) each; `PeerProtocolError` on junk."""
        return list(self.frames(data))

    def frames(self, data: bytes) -> Iterator[tuple[int, int, bytes]]:
        """`feed`, one frame at a time: each header is checked against `max_payload` as it is then, so a
        handler that raises the limit (the handshake done) applies to the frames after it in the same bytes."""
        buffer = self._buffer
        buffer += data
        offset = 0
        unpack = HEADER.unpack_from
        try:
            while len(buffer) - offset >= HEADER.size:
                kind, stream_id, length = unpack(buffer, offset)
                if kind not in KINDS:
                    raise PeerProtocolError(f"unknown frame kind {kind}")
                if length > self.max_payload:
                    raise PeerProtocolError(f"frame of {length} bytes (at most {self.max_payload})")
                end = offset + HEADER.size + length
                if end > len(buffer):
                    break
                payload = bytes(buffer[offset + HEADER.size : end])
                offset = end
                yield kind, stream_id, payload
        finally:
            if offset:
                del buffer[:offset]


def format_address(host: str, port: int) -> str:
    """`host:port`, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)

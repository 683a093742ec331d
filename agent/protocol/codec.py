"""Encoding and decoding: a frame as JSON text (control frames) or binary (stream data, batches), and back.

`decode` parses and validates one WebSocket message into the right frame dataclass, raising
`ProtocolError` (with a reason fit to send back in a close frame) for anything malformed.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from typing import Any, TypeVar

from agent.protocol.frames import FRAME_TYPES, Frame, StreamBatch, StreamData, StreamFrames
from agent.protocol.stream_frames import FRAMES_MAGIC, decode_stream_frames, encode_stream_frames
from agent.protocol.validation import from_dict, nesting_exceeds
from agent.protocol.versions import (
    MAX_FRAME_BYTES,
    MAX_NESTING,
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    STREAM_BATCH_SINCE,
    ProtocolError,
)

F = TypeVar("F", bound=Frame)


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
    if isinstance(frame, StreamFrames):
        return encode_stream_frames(frame.frames, frame.v)
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


def _decode_binary(raw: bytes) -> StreamData | StreamBatch | StreamFrames:
    if raw[:1] == bytes([BATCH_MAGIC]):
        return _decode_batch(raw)
    if raw[:1] == bytes([FRAMES_MAGIC]):
        return decode_stream_frames(raw)
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

    Text messages are JSON control frames; binary messages are `StreamData`, `StreamBatch` or `StreamFrames`.
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
    if cls is StreamData or cls is StreamBatch or cls is StreamFrames:
        raise ProtocolError("stream data must be sent as a binary message")
    if cls is None:
        raise ProtocolError(f"unknown frame type {frame_type!r}")
    body = {key: value for key, value in data.items() if key != "type"}
    return from_dict(cls, body, where=f"{frame_type} frame")

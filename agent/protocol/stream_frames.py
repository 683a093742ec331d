"""The binary layout of `StreamFrames` (protocol 5): several streams' opens, data, windows and ends in one message.

`encode_stream_frames` writes the layout described on `agent.protocol.frames.StreamFrames`;
`decode_stream_frames` reads it back, refusing anything malformed with a `ProtocolError` (a short or
overlong entry, an unknown kind, text that is not UTF-8, no entry at all, a version before 5).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from agent.protocol.frames import StreamData, StreamEnd, StreamFrame, StreamFrames, StreamOpen, StreamWindow
from agent.protocol.versions import MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, STREAM_FRAMES_SINCE, ProtocolError

FRAMES_MAGIC = 0xCF
KIND_OPEN, KIND_DATA, KIND_WINDOW, KIND_END = 1, 2, 3, 4
_HEADER = struct.Struct("!BB")  # magic, version
_ENTRY = struct.Struct("!BQI")  # kind, stream id, body length
_OPEN = struct.Struct("!HI")  # port, window (then the host)
_WINDOW = struct.Struct("!I")  # increment
ENTRY_OVERHEAD = _ENTRY.size  # bytes an entry adds besides its body
OPEN_OVERHEAD = _ENTRY.size + _OPEN.size  # bytes an open adds besides its host


def entry_size(frame: StreamFrame) -> int:
    """About how many bytes `frame` takes in a `StreamFrames` message (exact but for non-ASCII text)."""
    if type(frame) is StreamData:
        return ENTRY_OVERHEAD + len(frame.data)
    if type(frame) is StreamOpen:
        return OPEN_OVERHEAD + len(frame.host)
    if type(frame) is StreamEnd:
        return ENTRY_OVERHEAD + len(frame.error)
    return ENTRY_OVERHEAD + _WINDOW.size


def encode_stream_frames(frames: Sequence[StreamFrame], version: int = PROTOCOL_VERSION) -> bytes:
    """The binary `StreamFrames` message of `frames` at `version`.

    `ProtocolError` below STREAM_FRAMES_SINCE, for no frame at all, for a frame that is not a stream
    frame, or for a value its field cannot hold (a port over 65535, a negative increment...).
    """
    if version < STREAM_FRAMES_SINCE:
        raise ProtocolError(f"stream frames need protocol {STREAM_FRAMES_SINCE} (this tunnel speaks {version})")
    if not frames:
        raise ProtocolError("a stream frames message holds at least one frame")
    parts = [_HEADER.pack(FRAMES_MAGIC, version)]
    entry = _ENTRY.pack
    try:
        for frame in frames:
            if type(frame) is StreamData:
                parts.append(entry(KIND_DATA, frame.stream_id, len(frame.data)))
                parts.append(frame.data)
            elif type(frame) is StreamOpen:
                host = frame.host.encode()
                parts.append(entry(KIND_OPEN, frame.stream_id, _OPEN.size + len(host)))
                parts.append(_OPEN.pack(frame.port, frame.window))
                parts.append(host)
            elif type(frame) is StreamWindow:
                parts.append(entry(KIND_WINDOW, frame.stream_id, _WINDOW.size))
                parts.append(_WINDOW.pack(frame.increment))
            elif type(frame) is StreamEnd:
                error = frame.error.encode()
                parts.append(entry(KIND_END, frame.stream_id, len(error)))
                parts.append(error)
            else:
                raise ProtocolError(f"a {getattr(frame, 'TYPE', type(frame).__name__)} frame is not a stream frame")
    except struct.error as exc:
        raise ProtocolError(f"a stream frame's value does not fit its field: {exc}") from None
    return b"".join(parts)


def decode_stream_frames(raw: bytes) -> StreamFrames:
    """Read a binary `StreamFrames` message (magic byte included); `ProtocolError` if malformed."""
    if len(raw) < _HEADER.size:
        raise ProtocolError("stream frames message shorter than its header")
    _, version = _HEADER.unpack_from(raw)
    if not MIN_PROTOCOL_VERSION <= version <= PROTOCOL_VERSION:
        raise ProtocolError(
            f"unsupported protocol version {version!r} (this side speaks {MIN_PROTOCOL_VERSION}-{PROTOCOL_VERSION})"
        )
    if version < STREAM_FRAMES_SINCE:
        raise ProtocolError(f"stream frames need protocol {STREAM_FRAMES_SINCE} (the frame says {version})")
    frames: list[StreamFrame] = []
    offset, end = _HEADER.size, len(raw)
    unpack = _ENTRY.unpack_from
    while offset < end:
        if end - offset < _ENTRY.size:
            raise ProtocolError("stream frames message cut inside an entry header")
        kind, stream_id, length = unpack(raw, offset)
        offset += _ENTRY.size
        if length > end - offset:
            raise ProtocolError("stream frames entry runs past the end of the message")
        body = raw[offset : offset + length]
        offset += length
        frames.append(_entry(kind, stream_id, body, version))
    if not frames:
        raise ProtocolError("a stream frames message holds at least one frame")
    return StreamFrames(frames=frames, v=version)


def _entry(kind: int, stream_id: int, body: bytes, version: int) -> StreamFrame:
    if kind == KIND_DATA:
        return StreamData(stream_id=stream_id, data=body, v=version)
    if kind == KIND_WINDOW:
        if len(body) != _WINDOW.size:
            raise ProtocolError(f"a stream window entry's body is {_WINDOW.size} bytes, not {len(body)}")
        return StreamWindow(stream_id=stream_id, increment=_WINDOW.unpack(body)[0], id="", v=version)
    if kind == KIND_END:
        return StreamEnd(stream_id=stream_id, error=_text(body, "stream end error"), id="", v=version)
    if kind == KIND_OPEN:
        if len(body) < _OPEN.size:
            raise ProtocolError("a stream open entry is shorter than its port and window")
        port, window = _OPEN.unpack_from(body)
        host = _text(body[_OPEN.size :], "stream open host")
        return StreamOpen(stream_id=stream_id, port=port, window=window, host=host, id="", v=version)
    raise ProtocolError(f"unknown stream frames entry kind {kind}")


def _text(body: bytes, what: str) -> str:
    try:
        return body.decode()
    except UnicodeDecodeError:
        raise ProtocolError(f"{what} is not UTF-8") from None

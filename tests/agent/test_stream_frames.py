"""Protocol 5's `StreamFrames`: several streams' opens, data, windows and ends in one binary message.

Round trips in order, the refusal of anything malformed with a `ProtocolError` (by example and by a
property test over arbitrary and mutated messages), and no such message for a peer of protocol 4.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from agent import protocol as p

V = p.PROTOCOL_VERSION


def _mixed() -> list[p.StreamFrame]:
    return [
        p.StreamOpen(stream_id=1, port=8000, window=4096, id="", v=V),
        p.StreamData(stream_id=1, data=b"GET / HTTP/1.1\r\n\r\n", v=V),
        p.StreamEnd(stream_id=1, id="", v=V),
        p.StreamOpen(stream_id=2**52 - 1, port=8265, host="ray-head-svc.ns.svc", id="", v=V),
        p.StreamWindow(stream_id=7, increment=262144, id="", v=V),
        p.StreamData(stream_id=2**52 - 1, data=b"", v=V),
        p.StreamEnd(stream_id=9, error="closed by control plane: é", id="", v=V),
    ]


def test_stream_frames_round_trip_with_every_kind_in_order():
    raw = p.encode(p.StreamFrames(frames=_mixed()))
    assert isinstance(raw, bytes)
    assert raw[0] == p.FRAMES_MAGIC
    frame = p.decode(raw)
    assert isinstance(frame, p.StreamFrames)
    assert frame.v == V
    assert frame.frames == _mixed()


def test_an_open_with_its_request_and_end_costs_one_small_message():
    opening = [
        p.StreamOpen(stream_id=5, port=8000, id=""),
        p.StreamData(stream_id=5, data=b"x" * 100),
        p.StreamEnd(stream_id=5, id=""),
    ]
    separate = sum(len(p.encode(frame)) for frame in opening)
    together = len(p.encode_stream_frames(opening))
    assert together < separate


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_stream_frames_cannot_be_encoded_for_an_older_peer(version):
    with pytest.raises(p.ProtocolError, match="need protocol 5"):
        p.encode_stream_frames(_mixed(), version)
    with pytest.raises(p.ProtocolError, match="need protocol 5"):
        p.encode(p.at_version(p.StreamFrames(frames=_mixed()), version))


def test_the_separate_frames_of_a_protocol_4_peer_still_round_trip_at_4():
    for frame in [
        p.StreamOpen(stream_id=3, port=8000, host="h", v=4),
        p.StreamData(stream_id=3, data=b"abc", v=4),
        p.StreamWindow(stream_id=3, increment=10, v=4),
        p.StreamEnd(stream_id=3, error="boom", v=4),
    ]:
        assert p.decode(p.encode(p.at_version(frame, 4))) == frame


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([], "at least one frame"),
        ([p.StreamOpen(stream_id=1, port=70000, id="")], "does not fit"),
        ([p.StreamWindow(stream_id=1, increment=-1, id="")], "does not fit"),
        ([p.StreamData(stream_id=-1, data=b"")], "does not fit"),
        ([p.Ack(command_id="c")], "not a stream frame"),
    ],
)
def test_what_the_layout_cannot_hold_is_refused_when_encoding(frames, reason):
    with pytest.raises(p.ProtocolError, match=reason):
        p.encode_stream_frames(frames)


def _header(version: int = V) -> bytes:
    return bytes([p.FRAMES_MAGIC, version])


def _entry(kind: int, stream_id: int, body: bytes, length: int | None = None) -> bytes:
    return struct.pack("!BQI", kind, stream_id, len(body) if length is None else length) + body


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (_header()[:1], "shorter than its header"),
        (_header(), "at least one frame"),
        (_header(4) + _entry(2, 1, b"a"), "need protocol 5"),
        (_header(99) + _entry(2, 1, b"a"), "unsupported protocol version"),
        (_header() + _entry(2, 1, b"a") + b"\x02\x00", "cut inside an entry header"),
        (_header() + _entry(2, 1, b"abc", length=4), "runs past the end"),
        (_header() + _entry(2, 1, b"a") + _entry(2, 2, b"bb", length=2**32 - 1), "runs past the end"),
        (_header() + _entry(0, 1, b""), "unknown stream frames entry kind 0"),
        (_header() + _entry(9, 1, b""), "unknown stream frames entry kind 9"),
        (_header() + _entry(1, 1, b"\x1f\x40"), "shorter than its port and window"),
        (_header() + _entry(1, 1, struct.pack("!HI", 80, 10) + b"\xff\xfe"), "host is not UTF-8"),
        (_header() + _entry(3, 1, b"\x00\x00\x01"), "window entry's body is 4 bytes, not 3"),
        (_header() + _entry(3, 1, b"\x00\x00\x00\x01\x00"), "window entry's body is 4 bytes, not 5"),
        (_header() + _entry(4, 1, b"\xc3"), "error is not UTF-8"),
        ('{"v": 5, "type": "stream_frames", "frames": []}', "must be sent as a binary message"),
    ],
)
def test_malformed_stream_frames_are_refused_with_a_reason(raw, reason):
    with pytest.raises(p.ProtocolError, match=reason):
        p.decode(raw)


def test_stream_frames_are_not_control_frames():
    assert "stream_frames" not in p.CONTROL_FRAME_TYPES
    assert p.FRAME_TYPES["stream_frames"] is p.StreamFrames


stream_ids = st.integers(min_value=0, max_value=2**64 - 1)
texts = st.text(max_size=40)
entries = st.one_of(
    st.builds(
        lambda sid, port, window, host: p.StreamOpen(stream_id=sid, port=port, window=window, host=host, id=""),
        stream_ids,
        st.integers(0, 2**16 - 1),
        st.integers(0, 2**32 - 1),
        texts,
    ),
    st.builds(lambda sid, data: p.StreamData(stream_id=sid, data=data), stream_ids, st.binary(max_size=64)),
    st.builds(
        lambda sid, inc: p.StreamWindow(stream_id=sid, increment=inc, id=""), stream_ids, st.integers(0, 2**32 - 1)
    ),
    st.builds(lambda sid, error: p.StreamEnd(stream_id=sid, error=error, id=""), stream_ids, texts),
)


@hypothesis_settings(max_examples=300, deadline=None)
@given(st.lists(entries, min_size=1, max_size=20))
def test_any_stream_frames_round_trip(frames):
    decoded = p.decode(p.encode_stream_frames(frames))
    assert isinstance(decoded, p.StreamFrames)
    assert decoded.frames == frames  # each entry's version is the message's: PROTOCOL_VERSION, as made


def _decodes_or_is_refused(raw: bytes) -> None:
    """The decoder's promise: a `StreamFrames` of stream frames, or a `ProtocolError`, never anything else."""
    try:
        frame = p.decode(raw)
    except p.ProtocolError:
        return
    assert isinstance(frame, p.StreamFrames | p.StreamData | p.StreamBatch)
    if isinstance(frame, p.StreamFrames):
        assert frame.frames
        assert all(
            isinstance(entry, p.StreamOpen | p.StreamData | p.StreamWindow | p.StreamEnd) for entry in frame.frames
        )
        assert p.decode(p.encode(frame)) == frame  # what was accepted encodes back to itself


@hypothesis_settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_after_the_magic_decode_or_are_refused(tail):
    _decodes_or_is_refused(bytes([p.FRAMES_MAGIC]) + tail)
    _decodes_or_is_refused(_header() + tail)


@hypothesis_settings(max_examples=500, deadline=None)
@given(st.lists(entries, min_size=1, max_size=8), st.data())
def test_cut_or_corrupted_messages_decode_or_are_refused(frames, data):
    raw = bytearray(p.encode_stream_frames(frames))
    cut = data.draw(st.integers(0, len(raw)), label="cut")
    _decodes_or_is_refused(bytes(raw[:cut]))
    for _ in range(data.draw(st.integers(1, 4), label="flips")):
        at = data.draw(st.integers(0, len(raw) - 1), label="at")
        raw[at] = data.draw(st.integers(0, 255), label="byte")
    _decodes_or_is_refused(bytes(raw))

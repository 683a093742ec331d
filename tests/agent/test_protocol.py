"""The shared wire protocol: round trips, validation, and refusal of malformed frames."""

from __future__ import annotations

import json

import pytest

from agent import protocol as p


def test_every_frame_type_round_trips():
    frames = [
        p.Challenge(nonce="abc"),
        p.Hello(
            node_id="n1",
            certificate_pem="PEM",
            signature_b64="c2ln",
            facts=p.HostFacts(hostname="h", cpu_count=2, gpus=[p.GpuInfo(index=0, name="A100")]),
            inventory=p.Inventory(
                containers=[p.ContainerInfo(container_id="c", name="web", image="i", status="running")]
            ),
        ),
        p.Heartbeat(cpu_percent=12.5, memory_percent=40, gpus=[]),
        p.Command(command_id="c1", idempotency_key="k1", command_type="container.create", payload={"image": "x"}),
        p.Progress(command_id="c1", message="pulling", percent=50.0),
        p.Error(command_id="c1", code="image_pull_failed", message="manifest unknown"),
        p.StreamData.of(3, b"\x00\xffbytes"),
        p.Backoff(retry_after_s=30, reason="deploy"),
    ]
    for frame in frames:
        assert p.decode(p.encode(frame)) == frame


def test_encoded_frames_carry_version_type_and_id():
    data = json.loads(p.encode(p.Ack(command_id="c1")))
    assert data["v"] == p.PROTOCOL_VERSION
    assert data["type"] == "ack"
    assert len(data["id"]) == 32


def test_stream_data_carries_binary():
    frame = p.decode(p.encode(p.StreamData.of(1, bytes(range(256)))))
    assert isinstance(frame, p.StreamData)
    assert frame.payload() == bytes(range(256))


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"v": 99, "type": "ack", "command_id": "x"}', "unsupported protocol version"),
        ('{"v": 1, "type": "launch_missiles"}', "unknown frame type"),
        ('{"v": 1, "type": "ack"}', "missing required field 'command_id'"),
        ('{"v": 1, "type": "ack", "command_id": 5}', "must be a string"),
        ('{"v": 1, "type": "heartbeat", "cpu_percent": "hot", "memory_percent": 1}', "must be a number"),
        ('{"v": 1, "type": "ack", "command_id": "x", "extra": 1}', "unknown field"),
        ('{"v": 1, "type": "stream_window", "stream_id": true, "increment": 1}', "must be an integer"),
    ],
)
def test_malformed_frames_are_refused_with_a_reason(raw, reason):
    with pytest.raises(p.ProtocolError, match=reason):
        p.decode(raw)


def test_oversized_frame_is_refused():
    with pytest.raises(p.ProtocolError, match="exceeds"):
        p.decode("x" * (p.MAX_FRAME_BYTES + 1))


def _nested(depth: int) -> object:
    """A JSON value `depth` levels deep: {"a": {"a": ... {} ...}}."""
    value: object = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    "raw",
    [
        "[" * 500_000,  # past the interpreter's recursion limit: json.loads raises RecursionError
        '{"a":' * 200_000,
        json.dumps({"v": 1, "type": "progress", "command_id": "c", "message": "m", "data": _nested(p.MAX_NESTING)}),
    ],
    ids=["500k brackets", "200k objects", "valid frame one level too deep"],
)
def test_deeply_nested_frames_are_refused_with_a_protocol_error(raw):
    with pytest.raises(p.ProtocolError, match="nested deeper"):
        p.decode(raw)


def test_frames_nested_up_to_the_limit_are_accepted():
    data = _nested(p.MAX_NESTING - 1)  # frame → data → ...: exactly MAX_NESTING levels in all
    frame = p.decode(json.dumps({"v": 1, "type": "result", "command_id": "c", "data": data}))
    assert isinstance(frame, p.Result)
    assert frame.data == data
    assert p.decode(p.encode(frame)) == frame


def test_command_payloads_must_fit_in_a_command_frame():
    """A payload the control plane accepts (and stores) is one the agent can decode inside a Command."""
    job = {"cluster_id": "c", "member_id": "m", "submission_id": "s", "entrypoint": "python x.py"}
    fits = {**job, "runtime_env": _nested(p.MAX_NESTING - 2)}
    p.parse_payload("ray.job.submit", fits)
    command = p.Command(command_id="c", idempotency_key="k", command_type="ray.job.submit", payload=fits)
    assert p.decode(p.encode(command)) == command
    with pytest.raises(p.ProtocolError, match="nested deeper"):
        p.parse_payload("ray.job.submit", {**job, "runtime_env": _nested(p.MAX_NESTING - 1)})


def test_payloads_are_validated_per_command_type():
    create = p.parse_payload(
        "container.create",
        {"image": "busybox", "name": "web", "ports": [{"container_port": 80}], "env": {"A": "1"}},
    )
    assert create.ports == [p.PortMapping(container_port=80)]
    with pytest.raises(p.ProtocolError, match="missing required field 'image'"):
        p.parse_payload("container.create", {"name": "web"})
    with pytest.raises(p.ProtocolError, match="must be one of"):
        p.parse_payload(
            "container.create", {"image": "i", "name": "n", "ports": [{"container_port": 1, "protocol": "sctp"}]}
        )
    with pytest.raises(p.ProtocolError, match="unknown command type"):
        p.parse_payload("container.explode", {})


def test_every_command_type_has_a_payload_type():
    assert set(p.COMMAND_TYPES) == set(p.PAYLOAD_TYPES)


# ---- protocol 3: several streams' data in one message


def test_a_stream_batch_round_trips_with_its_chunks_in_order():
    chunks = [(1, b"a"), (2**64 - 1, bytes(range(256))), (1, b""), (7, b"\x00" * 70_000), (1, b"z")]
    raw = p.encode(p.StreamBatch(chunks=chunks))
    assert isinstance(raw, bytes)
    frame = p.decode(raw)
    assert isinstance(frame, p.StreamBatch)
    assert frame.v == p.PROTOCOL_VERSION
    assert [(sid, bytes(data)) for sid, data in frame.chunks] == chunks


def test_a_stream_batch_cannot_be_encoded_for_a_protocol_2_peer():
    with pytest.raises(p.ProtocolError, match="protocol 3"):
        p.encode_batch([(1, b"a"), (2, b"b")], version=2)


def _batch_header(version: int = p.PROTOCOL_VERSION) -> bytes:
    return bytes([p.BATCH_MAGIC, version])


def _chunk(stream_id: int, data: bytes, length: int | None = None) -> bytes:
    return stream_id.to_bytes(8, "big") + (len(data) if length is None else length).to_bytes(4, "big") + data


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (bytes([p.BATCH_MAGIC]), "shorter than its header"),
        (_batch_header(), "at least one chunk"),
        (_batch_header(2) + _chunk(1, b"a"), "need protocol 3"),
        (_batch_header(99) + _chunk(1, b"a"), "unsupported protocol version"),
        (_batch_header() + _chunk(1, b"a") + b"\x00\x01\x02", "cut inside a chunk header"),
        (_batch_header() + _chunk(1, b"abc", length=4), "runs past the end"),
        (_batch_header() + _chunk(1, b"a") + _chunk(2, b"bb", length=2**32 - 1), "runs past the end"),
        (b"\xcf\x03" + _chunk(1, b"a"), "bad magic byte"),
        ('{"v": 3, "type": "stream_batch", "chunks": []}', "must be sent as a binary message"),
    ],
)
def test_malformed_stream_batches_are_refused_with_a_reason(raw, reason):
    with pytest.raises(p.ProtocolError, match=reason):
        p.decode(raw)


def test_stream_batches_are_not_control_frames():
    assert "stream_batch" not in p.CONTROL_FRAME_TYPES
    assert "stream_data" not in p.CONTROL_FRAME_TYPES

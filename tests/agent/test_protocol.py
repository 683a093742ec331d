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
        (b"\xd0\x03" + _chunk(1, b"a"), "bad magic byte"),
        ('{"v": 3, "type": "stream_batch", "chunks": []}', "must be sent as a binary message"),
    ],
)
def test_malformed_stream_batches_are_refused_with_a_reason(raw, reason):
    with pytest.raises(p.ProtocolError, match=reason):
        p.decode(raw)


def test_stream_batches_are_not_control_frames():
    assert "stream_batch" not in p.CONTROL_FRAME_TYPES
    assert "stream_data" not in p.CONTROL_FRAME_TYPES


# ---- payload rules (field metadata) enforced by parse_payload / from_dict

CREATE = {"image": "nginx", "name": "web"}


@pytest.mark.parametrize(
    ("command_type", "payload", "reason"),
    [
        ("container.create", {**CREATE, "image": ""}, "image may not be blank"),
        ("container.create", {**CREATE, "image": "i" * 501}, "image is longer than 500"),
        ("container.create", {**CREATE, "name": "-web"}, "Use letters, digits, _ . -"),
        ("container.create", {**CREATE, "gpus": 65}, "gpus must be at most 64"),
        ("container.create", {**CREATE, "cpu": -0.5}, "cpu must be at least 0"),
        ("container.create", {**CREATE, "command": ["x"] * 65}, "holds more than 64 items"),
        ("container.create", {**CREATE, "command": ["x" * 1001]}, r"command\[0\] is longer than 1000"),
        ("container.create", {**CREATE, "env": {"K": "v" * 4001}}, "is longer than 4000"),
        ("container.create", {**CREATE, "ports": [{"container_port": 0}]}, "container_port must be at least 1"),
        ("container.create", {**CREATE, "ports": [{"container_port": 80, "host_port": 65536}]}, "at most 65535"),
        ("container.stop", {"container": "c", "timeout_s": 3601}, "timeout_s must be at most 3600"),
        ("model.download", {"model_id": "../../etc"}, r"Not a valid model id \(expected owner/name\)"),
        ("model.download", {"model_id": "org/m", "revision": ""}, "revision may not be blank"),
        ("endpoint.start", {"endpoint_id": "ep1", "model_id": "org/m"}, "An endpoint id is 12 hex digits"),
        ("endpoint.start", {"endpoint_id": "0123456789ab", "model_id": "org/m", "port": 70000}, "at most 65535"),
        ("ray.head.start", {"cluster_id": "c", "member_id": "m", "ray_version": "2.9", "image": "r"}, "ray_version"),
        ("ray.node.drain", {"cluster_id": "c", "member_id": "m", "ray_node_id": "xyz"}, "ray_node_id"),
        ("ray.job.status", {"cluster_id": "c", "member_id": "m", "submission_id": "s", "log_lines": 5001}, "5000"),
        (
            "ray.job.submit",
            {"cluster_id": "c", "member_id": "m", "submission_id": "s", "entrypoint": "e", "files": {"../x": ""}},
            r"Bad file name\(s\): \.\./x",
        ),
    ],
)
def test_payload_rules_are_enforced_by_the_agent(command_type, payload, reason):
    with pytest.raises(p.ProtocolError, match=reason):
        p.parse_payload(command_type, payload)


def test_payload_bounds_themselves_are_accepted():
    payload = {**CREATE, "name": "w" * 128, "gpus": 64, "cpu": 1024, "command": ["x" * 1000] * 64}
    assert p.parse_payload("container.create", payload).gpus == 64
    assert p.parse_payload("container.stop", {"container": "c", "timeout_s": 0}).timeout_s == 0


def test_every_default_passes_its_own_rule():
    """What the control plane stores (every field, defaults filled in) is what the agent accepts."""
    required = {
        "container.create": CREATE,
        "container.start": {"container": "c"},
        "model.download": {"model_id": "org/m"},
        "endpoint.start": {"endpoint_id": "0123456789ab", "model_id": "org/m"},
        "endpoint.stop": {"endpoint_id": "0123456789ab"},
        "ray.head.start": {"cluster_id": "c", "member_id": "m", "ray_version": "2.9.0", "image": "r"},
        "ray.job.submit": {"cluster_id": "c", "member_id": "m", "submission_id": "s", "entrypoint": "e"},
    }
    for command_type, payload in required.items():
        parsed = p.parse_payload(command_type, payload)
        assert p.parse_payload(command_type, p.to_dict(parsed)) == parsed


def test_every_api_payload_field_carries_a_rule():
    """Bounds live in the protocol: each field of the payloads the API accepts is bounded (bool and Literal
    fields are bounded by their type)."""
    import dataclasses
    import typing

    for command_type, cls in p.PAYLOAD_TYPES.items():
        if command_type == "agent.update":
            continue
        hints = typing.get_type_hints(cls)
        for fld in dataclasses.fields(cls):
            if hints[fld.name] is bool or typing.get_origin(hints[fld.name]) is typing.Literal:
                continue
            if fld.name == "runtime_env":  # free-form (Ray's own runtime_env), bounded by the frame's nesting
                continue
            assert "rule" in fld.metadata, (command_type, fld.name)


def test_rule_metadata_merges_with_since():
    meta = p.rule(max_length=3, since=2)
    assert meta["since"] == 2
    assert meta["rule"].max_length == 3


# ---- typed results


def test_results_are_built_strictly_and_sent_without_unreported_fields():
    data = {"container_id": "c1", "name": "web", "status": "running", "ports": {"80": 8080}, "existed": False}
    result = p.build_result("container.create", data)
    assert isinstance(result, p.ContainerResult)
    assert result.ports == {"80": 8080}
    assert result.commit is None
    assert p.result_to_dict(result) == data  # the JSON shape the handler gave, nothing added
    with pytest.raises(p.ProtocolError, match="unknown field"):
        p.build_result("container.create", {**data, "surprise": 1})
    with pytest.raises(p.ProtocolError, match="must be a boolean"):
        p.build_result("container.create", {**data, "existed": "no"})


def test_results_are_read_leniently_across_versions():
    """An agent of another protocol version: extra fields are ignored, missing ones take their defaults and
    an ill-typed one reads as absent; parse_result never raises."""
    newer = p.parse_result("ray.head.start", {"container_id": "c", "ip": "10.0.0.2", "gpu_model": "H200"})
    assert (newer.container_id, newer.ip, newer.ray_node_id, newer.pid) == ("c", "10.0.0.2", "", None)
    odd = p.parse_result("endpoint.start", {"endpoint_id": "e", "port": "8000", "pid": True})
    assert (odd.endpoint_id, odd.port, odd.pid) == ("e", 0, 0)
    status = p.parse_result(
        "ray.status", {"nodes": [{"ray_node_id": "n1", "idle_s": 3, "new": 1}], "kuberay": {"head_host": "h"}}
    )
    assert status.nodes[0].idle_s == 3.0
    assert status.kuberay.head_host == "h"
    assert p.parse_result("model.download", "not an object") == p.ModelDownloadResult()
    assert p.parse_result("no.such.type", {}) is None
    assert set(p.RESULT_TYPES) == set(p.COMMAND_TYPES)


def test_job_status_times_keep_their_json_type():
    data = {"submission_id": "s", "status": "RUNNING", "start_time": 1700000000000, "end_time": None}
    result = p.build_result("ray.job.status", data)
    assert p.result_to_dict(result)["start_time"] == 1700000000000
    assert isinstance(p.result_to_dict(result)["start_time"], int)

"""The API's payload validation (derived from the protocol) and the agent's `parse_payload` agree for every
command type: table-driven cases made from each field's type and rule, at and past every bound.

For each case: the API accepts it exactly when the agent does, and what the API stores (defaults filled in)
the agent parses to the same payload. Bounds violations are refused by both. Where the API normalizes a
value as Django REST framework does (a number given for a string becomes that string, surrounding
whitespace is trimmed), the agent only ever sees, and accepts, the normalized form.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

import pytest
from django.core.exceptions import ValidationError

from agent import protocol as p
from agent.protocol import rules
from fleet.payloads import PAYLOAD_FILLS, PAYLOAD_SERIALIZERS, validate_payload

API_TYPES = [t for t in p.COMMAND_TYPES if t != "agent.update"]  # agent.update is the control plane's own

SAMPLES = {  # a valid value per pattern
    rules.NAME_RE: "web-1",
    rules.ENDPOINT_ID_RE: "0123456789ab",
    rules.MODEL_ID_RE: "org/model",
    rules.REVISION_RE: "main",
    rules.RAY_VERSION_RE: "2.9.0",
    rules.HEAD_ADDRESS_RE: "10.0.0.1:6379",
    rules.RAY_NODE_ID_RE: "abc123",
    rules.HOST_RE: "ray-head.default.svc",
    rules.KUBE_NAME_RE: "rc-1",
}
BAD_STRINGS = ["bad value!", "-x", "ü", "a/b/c"]


def _sample(hint: Any, found: rules.Rule) -> Any:
    if hint is str:
        return SAMPLES.get(found.pattern, "x") if found.pattern else "x"
    if hint is int or hint is float:
        return hint(found.min if found.min is not None and found.min > 0 else 1)
    if dataclasses.is_dataclass(hint):
        return _minimal(hint)
    raise AssertionError(f"no sample for required {hint!r}")


# Optional fields a valid value of a class needs one of (an adapter names its Hub repository or its path).
MINIMAL_EXTRA: dict[type, dict[str, Any]] = {
    p.LoraAdapterRef: {"model_id": "org/adapter", "revision": "main", "path": ""}
}


def _minimal(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    found = rules.field_rules(cls)
    return {
        **{
            f.name: _sample(hints[f.name], found.get(f.name, rules.Rule()))
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        },
        **MINIMAL_EXTRA.get(cls, {}),
    }


def _values(hint: Any, found: rules.Rule) -> list[Any]:
    """Values for one field: inside, at and past each of its bounds, and of the wrong type."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        return [*typing.get_args(hint), "bogus", None]
    if hint is bool:
        return [True, False, None, [1]]
    if hint is int or hint is float:
        out: list[Any] = [None, "", [1]]
        for bound in (found.min, found.max):
            if bound is not None:
                out += [hint(bound), hint(bound) - 1, hint(bound) + 1]
        if hint is float:
            out.append(0.5)
        return out
    if hint is str:
        base = SAMPLES.get(found.pattern, "x") if found.pattern else "x"
        out = ["", base, None, 5.5, [base]]
        if found.max_length is not None:
            out += [base[0] * found.max_length, base[0] * (found.max_length + 1)]
        if found.pattern is not None:
            out += BAD_STRINGS
        return out
    if origin is list:
        (item,) = typing.get_args(hint)
        one = _minimal(item) if dataclasses.is_dataclass(item) else "x"
        out = [[], [one], "x", {"a": 1}]
        if found.items_max is not None:
            out += [[one] * found.items_max, [one] * (found.items_max + 1)]
        if found.item_max_length is not None:
            out += [["y" * found.item_max_length], ["y" * (found.item_max_length + 1)]]
        if dataclasses.is_dataclass(item):
            out += [[{**one, name: value}] for name, value in _cases(item)]
        else:
            out += [[1], [None]]
        return out
    if origin is dict:
        out = [{}, {"K": "v"}, [], "x"]
        if typing.get_args(hint)[1] is str:
            out += [{"K": 1}, {"K": None}]
        if found.item_max_length is not None:
            out += [{"K": "y" * found.item_max_length}, {"K": "y" * (found.item_max_length + 1)}]
        if found.key_pattern is not None:
            out += [{"ok.py": "v", "../etc": "v"}, {"": "v"}]
        return out
    if dataclasses.is_dataclass(hint):
        return [_minimal(hint), "x"]
    raise AssertionError(f"no cases for {hint!r}")


def _cases(cls: type) -> list[tuple[str, Any]]:
    hints = typing.get_type_hints(cls)
    found = rules.field_rules(cls)
    return [
        (f.name, value)
        for f in dataclasses.fields(cls)
        for value in _values(hints[f.name], found.get(f.name, rules.Rule()))
    ]


def _payloads(command_type: str) -> list[dict[str, Any]]:
    cls = p.PAYLOAD_TYPES[command_type]
    base = _minimal(cls)
    out = [base, {**base, "surprise": 1}]
    out += [{k: v for k, v in base.items() if k != name} for name in base]  # each required field left out
    out += [{**base, name: value} for name, value in _cases(cls)]
    return out


def _api(command_type: str, payload: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return validate_payload(command_type, payload)
    except ValidationError:
        return None


def _agent(command_type: str, payload: dict[str, Any]) -> Any:
    try:
        return p.parse_payload(command_type, payload)
    except p.ProtocolError:
        return None


def _as_stored(payload: Any) -> dict[str, Any]:
    """The payload as the API stores it: a field sent only when set (`SENT_WHEN_SET`) is left out while it holds
    its default, inside a nested dataclass too (`EndpointGroup.container`)."""
    data = p.to_dict(payload)
    for fld in dataclasses.fields(payload):
        value = getattr(payload, fld.name)
        if dataclasses.is_dataclass(value):
            data[fld.name] = _as_stored(value)
        if not fld.metadata.get("sent_when_set"):
            continue
        default = fld.default_factory() if fld.default_factory is not dataclasses.MISSING else fld.default
        if data[fld.name] == (_as_stored(default) if dataclasses.is_dataclass(default) else p.to_dict(default)):
            del data[fld.name]
    return data


def test_a_nested_field_sent_only_when_set_is_left_out_while_it_holds_its_default():
    group = {"pipeline_parallel": 2, "nnodes": 2, "master_addr": "10.0.0.1", "master_port": 29500}
    stored = validate_payload("endpoint.start", {"endpoint_id": "ab" * 6, "model_id": "o/m", "group": group})
    assert "container" not in stored["group"]  # an agent that predates the field reads the group it did
    assert stored["group"]["pipeline_parallel"] == 2
    inside = validate_payload(
        "endpoint.start", {"endpoint_id": "ab" * 6, "model_id": "o/m", "group": {**group, "container": "ray-w1"}}
    )
    assert inside["group"]["container"] == "ray-w1"
    plain_start = validate_payload("endpoint.start", {"endpoint_id": "ab" * 6, "model_id": "o/m", "group": {}})
    assert "group" not in plain_start  # the whole group at its default is left out as before


@pytest.mark.parametrize("command_type", API_TYPES)
def test_the_api_and_the_agent_accept_the_same_payloads(command_type):
    assert command_type in PAYLOAD_SERIALIZERS
    filled = set(PAYLOAD_FILLS.get(command_type, {}))
    accepted = refused = 0
    for payload in _payloads(command_type):
        stored = _api(command_type, payload)
        parsed = _agent(command_type, payload)
        if stored is not None:
            # what the API stores (every field, defaults filled in), the agent parses, to the same payload
            from_stored = _agent(command_type, stored)
            assert from_stored is not None, (payload, stored)
            assert _as_stored(from_stored) == stored, payload
            if parsed is not None:
                assert from_stored == parsed, payload
        if filled - set(payload):
            assert stored is not None  # the control plane made the field up; the agent never sees it left out
            continue
        if stored is not None and any(k in stored and stored[k] != v for k, v in payload.items()):
            continue  # the API normalized a value (DRF coerces JSON scalars: 5 → "5"); the agent got that form
        assert (stored is not None) == (parsed is not None), (payload, stored, parsed)
        accepted += stored is not None
        refused += stored is None
    assert accepted > 1
    assert refused > 1


def test_bound_violations_are_refused_by_both_with_the_same_messages():
    payload = {"image": "nginx", "name": "web", "gpus": 65, "command": ["x"] * 65}
    with pytest.raises(ValidationError) as api:
        validate_payload("container.create", payload)
    assert set(api.value.message_dict) == {"payload.gpus", "payload.command"}
    assert _agent("container.create", payload) is None
    files = {"cluster_id": "c", "member_id": "m", "submission_id": "s", "entrypoint": "e", "files": {"../x": ""}}
    with pytest.raises(ValidationError) as api:
        validate_payload("ray.job.submit", files)
    assert api.value.message_dict["payload.files"] == ["Bad file name(s): ../x"]
    with pytest.raises(p.ProtocolError, match=r"Bad file name\(s\): \.\./x"):
        p.parse_payload("ray.job.submit", files)
    for command_type, bad, message in [
        ("model.download", {"model_id": "bad id!"}, "Not a valid model id (expected owner/name)."),
        ("container.create", {"image": "i", "name": "a b"}, "Use letters, digits, _ . -"),
        ("endpoint.start", {"endpoint_id": "e1", "model_id": "o/m"}, "An endpoint id is 12 hex digits"),
    ]:
        with pytest.raises(ValidationError) as api:
            validate_payload(command_type, bad)
        assert message in " ".join(m for ms in api.value.message_dict.values() for m in ms)
        with pytest.raises(p.ProtocolError, match=message.replace("(", r"\(").replace(")", r"\)")):
            p.parse_payload(command_type, bad)


def test_the_api_fills_in_what_the_agent_needs():
    stored = validate_payload("endpoint.start", {"model_id": "org/m"})
    assert len(stored["endpoint_id"]) == 12
    assert stored == _as_stored(p.parse_payload("endpoint.start", stored))
    ports = validate_payload("container.create", {"image": "i", "name": "w", "ports": [{"container_port": 80}]})
    assert ports["ports"] == [{"container_port": 80, "host_port": 0, "protocol": "tcp"}]
    assert ports["start"] is True


def test_endpoint_start_leaves_out_a_group_it_was_not_given_so_older_agents_accept_it():
    """`group` (multi-node endpoints) came later: agents before it refuse unknown fields, so a payload that
    names no group (or the one-node default) goes without it, and one that names a group keeps it."""
    plain_start = validate_payload("endpoint.start", {"model_id": "acme/m"})
    assert "group" not in plain_start
    assert "group" not in validate_payload("endpoint.start", p.EndpointStartPayload("0123456789ab", "acme/m"))
    group = p.EndpointGroup(pipeline_parallel=2, nnodes=2, master_addr="10.0.0.5", master_port=29500)
    sent = validate_payload("endpoint.start", p.EndpointStartPayload("0123456789ab", "acme/m", group=group))
    assert sent["group"] == {k: v for k, v in p.to_dict(group).items() if k != "container"}  # sent only when set
    assert p.parse_payload("endpoint.start", plain_start).group == p.EndpointGroup()
    with pytest.raises(ValidationError) as refused:
        validate_payload("endpoint.start", {"model_id": "acme/m", "group": {"role": "boss"}})
    assert "payload.group" in refused.value.message_dict

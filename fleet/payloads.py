"""Validation of command payloads: the API's serializers derived from `agent.protocol`'s payload dataclasses.

`PAYLOAD_SERIALIZERS` maps each command type the API accepts to `fleet.payload_schema.serializer_for` of its
protocol payload (the Ray apps add theirs at start, `register_payload_types`), so the bounds, patterns and
messages are defined once, in the protocol, and the agent's `parse_payload` enforces the same. `validate_payload`
gives field messages (a `ValidationError` keyed by payload field) and returns the payload with its defaults
filled in, exactly as the agent will parse it.

Secrets: `split_secrets` takes out of the stored payload what must stay secret: `registry_password`
(dropped), every value of `env` and of `runtime_env.env_vars` (keys kept, values masked), and the
fields the caller lists in `secret_fields` (masked; only the free-text fields in `MARKABLE_FIELDS`).
The originals go to `Command.secrets` (encrypted) and come back only in `Command.wire_payload()`.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
import uuid
from collections.abc import Iterable
from typing import Any

from django.core.exceptions import ValidationError
from rest_framework import serializers

from agent import protocol
from agent.protocol.codec import to_dict
from fleet.payload_schema import plain, serializer_for

SECRET_FIELDS = frozenset({"registry_password"})  # never kept in the payload, not even masked
# Mappings whose every value is secret (their keys stay visible): container env, a Ray job's env_vars.
SECRET_MAPPINGS: tuple[tuple[str, str | None], ...] = (("env", None), ("runtime_env", "env_vars"))
# Fields a caller may mark secret with `"secret_fields": [...]`: free text the control plane never reads.
MARKABLE_FIELDS = frozenset(
    {"command", "registry_username", "extra_args", "entrypoint", "files", "metadata", "runtime_env"}
)
MARKS = "secret_fields"
MASK = "••••••"


def new_endpoint_id() -> str:
    """A fresh endpoint id (12 hex digits): endpoint.start without one starts a new endpoint (the Commands
    tab does that), the same id restarts a stopped one."""
    return uuid.uuid4().hex[:12]


# Per-command behaviour the protocol does not describe: fields the control plane makes up when left out.
PAYLOAD_FILLS: dict[str, dict[str, Any]] = {"endpoint.start": {"endpoint_id": new_endpoint_id}}

PAYLOAD_SERIALIZERS: dict[str, type[serializers.Serializer]] = {}
# Command types an app sends through its own services only (they admit, place and record them), each with
# the API to use instead: the generic command API and the Commands tab refuse them (`command_dispatch`).
OWNED_COMMANDS: dict[str, str] = {}


def register_payload_types(command_types: Iterable[str], *, owner_api: str = "") -> None:
    """Let the control plane validate `command_types` as their `agent.protocol` payload says (idempotent);
    with `owner_api` (the API that sends them, in words) only the owning app's services send them."""
    for command_type in command_types:
        if owner_api:
            OWNED_COMMANDS[command_type] = owner_api
        if command_type not in PAYLOAD_SERIALIZERS:
            cls = protocol.PAYLOAD_TYPES[command_type]
            PAYLOAD_SERIALIZERS[command_type] = serializer_for(cls, fill=PAYLOAD_FILLS.get(command_type))


register_payload_types(protocol.WORKLOAD_COMMAND_TYPES)


def validate_payload(command_type: Any, payload: Any) -> dict[str, Any]:
    """Return the normalized payload for `command_type` or raise `ValidationError` with field messages.

    `payload` is what a caller sent (a JSON object), or the command type's protocol dataclass the control
    plane built itself (`protocol.EndpointStopPayload(endpoint_id=...)`), checked the same way."""
    if command_type not in PAYLOAD_SERIALIZERS:
        raise ValidationError(
            {"command_type": f"Unknown command type; choose one of {', '.join(protocol.COMMAND_TYPES)}."}
        )
    if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
        if not isinstance(payload, protocol.PAYLOAD_TYPES[command_type]):
            raise ValidationError({"payload": f"Not a {command_type} payload: {type(payload).__name__}."})
        payload = protocol.to_dict(payload)
    if not isinstance(payload, dict):
        raise ValidationError({"payload": "The payload must be a JSON object."})
    if protocol.nesting_exceeds(payload, protocol.MAX_NESTING - 1):  # it travels inside a Command frame
        raise ValidationError({"payload": f"The payload is nested deeper than {protocol.MAX_NESTING - 1} levels."})
    payload = dict(payload)
    marks = payload.pop(MARKS, [])
    serializer = PAYLOAD_SERIALIZERS[command_type](data=payload)
    errors: dict[str, Any] = {}
    if not serializer.is_valid():
        errors.update({f"payload.{k}": _messages(v) for k, v in serializer.errors.items()})
    unknown = sorted(set(payload) - set(serializer.fields))
    for name in unknown:
        errors[f"payload.{name}"] = ["Unknown field."]
    marked = _check_marks(marks, set(serializer.fields), errors)
    if errors:
        raise ValidationError(errors)
    clean = _unset_left_out(command_type, plain(dict(serializer.validated_data)))
    if marked:
        clean[MARKS] = marked
    return clean


def _unset_left_out(command_type: str, clean: dict[str, Any]) -> dict[str, Any]:
    """`clean` without the fields sent only when set (`protocol.SENT_WHEN_SET`) that hold their default, at
    any depth (a nested dataclass's own such fields too: `EndpointGroup.container` inside endpoint.start's
    `group`), so an agent that predates a field reads every payload it did before."""
    return _drop_unset(protocol.PAYLOAD_TYPES[command_type], clean)


@functools.cache
def _nested_dataclasses(cls: type) -> dict[str, type]:
    """The fields of payload dataclass `cls` that hold one dataclass (not a list of them), by name."""
    hints = typing.get_type_hints(cls)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(cls)
        if isinstance(hints[f.name], type) and dataclasses.is_dataclass(hints[f.name])
    }


def _drop_unset(cls: type, clean: dict[str, Any]) -> dict[str, Any]:
    nested = _nested_dataclasses(cls)
    for f in dataclasses.fields(cls):
        if f.name not in clean:
            continue
        inner = nested.get(f.name)
        if inner is not None and isinstance(clean[f.name], dict):
            clean[f.name] = _drop_unset(inner, dict(clean[f.name]))
        if f.metadata.get("sent_when_set"):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            default = to_dict(default)
            if inner is not None and isinstance(default, dict):
                default = _drop_unset(inner, default)
            if to_dict(clean[f.name]) == default:
                del clean[f.name]
    return clean


def _messages(value: Any, path: str = "") -> list[str]:
    """DRF's errors of one payload field (nested serializers and lists give dicts and lists of them) as
    flat messages, each naming where inside the field it applies (`0.container_port: ...`)."""
    if isinstance(value, dict):
        return [m for key, inner in value.items() for m in _messages(inner, f"{path}{key}.")]
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        return [m for i, inner in enumerate(value) for m in _messages(inner, f"{path}{i}.")]
    items = value if isinstance(value, list) else [value]
    return [f"{path[:-1]}: {v}" if path else str(v) for v in items]


def _check_marks(marks: Any, fields: set[str], errors: dict[str, Any]) -> list[str]:
    """The sorted field names of a valid `secret_fields`; messages for a bad one go into `errors`."""
    if not isinstance(marks, list) or not all(isinstance(m, str) for m in marks):
        errors[f"payload.{MARKS}"] = ["Must be a list of payload field names."]
        return []
    markable = sorted(fields & MARKABLE_FIELDS)
    bad = sorted({m for m in marks if m not in markable})
    if bad:
        allowed = ", ".join(markable) if markable else "none for this command type"
        errors[f"payload.{MARKS}"] = [f"Cannot mark {', '.join(bad)} secret; markable fields: {allowed}."]
        return []
    return sorted(set(marks))


def mask(value: Any) -> Any:
    """`value` with every secret string replaced by `MASK` (mapping keys and list lengths kept)."""
    if isinstance(value, dict):
        return {k: MASK for k in value}
    if isinstance(value, list):
        return [MASK for _ in value]
    return MASK


def split_secrets(payload: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Separate a validated payload into what may be stored and shown, and its secrets.

    Returns `(public, secrets)`: `secrets` maps top-level field names to their original values (stored
    encrypted; `join_secrets` puts them back), `public` has `registry_password` dropped and the secret
    values masked. Empty values have nothing to hide and stay as they are.
    """
    public = {k: v for k, v in payload.items() if k not in SECRET_FIELDS}
    secrets = {k: v for k, v in payload.items() if k in SECRET_FIELDS and v}
    for head, key in SECRET_MAPPINGS:
        value = payload.get(head)
        inner = value.get(key) if key and isinstance(value, dict) else value
        if not isinstance(inner, dict) or not inner:
            continue
        secrets[head] = value
        # runtime_env: only env_vars is masked, the rest (pip, …) stays visible
        public[head] = {**value, key: mask(inner)} if key else mask(inner)
    for name in payload.get(MARKS, ()):
        if payload.get(name) not in (None, "", [], {}):
            secrets[name] = payload[name]
            public[name] = mask(payload[name])
    return public, secrets


def join_secrets(public: dict[str, Any], secrets: dict[str, Any]) -> dict[str, Any]:
    """The payload as submitted (what `split_secrets` was given), `secret_fields` included."""
    return {**public, **secrets}


def wire(payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` as the agent accepts it: without the control plane's `secret_fields` marks."""
    return {k: v for k, v in payload.items() if k != MARKS}


def has_masked_secrets(public: dict[str, Any]) -> bool:
    """Whether a stored (public) payload had secrets taken out: sending it again would send masks."""
    if public.get(MARKS):
        return True
    for head, key in SECRET_MAPPINGS:
        inner = public.get(head)
        if key and isinstance(inner, dict):
            inner = inner.get(key)
        if isinstance(inner, dict) and MASK in inner.values():
            return True
    return False

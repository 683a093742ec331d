"""Field-level validation of command payloads, one DRF serializer per command type.

`validate_payload` gives field messages (a `ValidationError` keyed by payload field) and then checks
the result against `agent.protocol.parse_payload`, so what is stored is exactly what the agent accepts.

Secrets: `split_secrets` takes out of the stored payload what must stay secret: `registry_password`
(dropped), every value of `env` and of `runtime_env.env_vars` (keys kept, values masked), and the
fields the caller lists in `secret_fields` (masked; only the free-text fields in `MARKABLE_FIELDS`).
The originals go to `Command.secrets` (encrypted) and come back only in `Command.wire_payload()`.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.core.exceptions import ValidationError
from rest_framework import serializers

from agent import protocol

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
ENDPOINT_ID_RE = r"^[0-9a-f]{12}$"
MODEL_ID_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$"
SECRET_FIELDS = frozenset({"registry_password"})  # never kept in the payload, not even masked
# Mappings whose every value is secret (their keys stay visible): container env, a Ray job's env_vars.
SECRET_MAPPINGS: tuple[tuple[str, str | None], ...] = (("env", None), ("runtime_env", "env_vars"))
# Fields a caller may mark secret with `"secret_fields": [...]`: free text the control plane never reads.
MARKABLE_FIELDS = frozenset(
    {"command", "registry_username", "extra_args", "entrypoint", "files", "metadata", "runtime_env"}
)
MARKS = "secret_fields"
MASK = "••••••"
MAX_LIST = 64


def _strings(max_length: int = 1000, **kwargs: Any) -> serializers.ListField:
    return serializers.ListField(
        child=serializers.CharField(max_length=max_length, allow_blank=True), max_length=MAX_LIST, **kwargs
    )


def _mapping(**kwargs: Any) -> serializers.DictField:
    return serializers.DictField(child=serializers.CharField(max_length=4000, allow_blank=True), **kwargs)


class PortMappingSerializer(serializers.Serializer):
    """A published port."""

    container_port = serializers.IntegerField(min_value=1, max_value=65535)
    host_port = serializers.IntegerField(min_value=0, max_value=65535, required=False)
    protocol = serializers.ChoiceField(choices=["tcp", "udp"], required=False)


class ContainerCreateSerializer(serializers.Serializer):
    """container.create."""

    image = serializers.CharField(max_length=500)
    name = serializers.RegexField(NAME_RE, max_length=128, error_messages={"invalid": "Use letters, digits, _ . -"})
    command = _strings(required=False)
    env = _mapping(required=False)
    ports = PortMappingSerializer(many=True, required=False, max_length=MAX_LIST)
    cpu = serializers.FloatField(min_value=0, max_value=1024, required=False)
    memory_mb = serializers.IntegerField(min_value=0, max_value=16 * 1024 * 1024, required=False)
    gpus = serializers.IntegerField(min_value=0, max_value=64, required=False)
    labels = _mapping(required=False)
    endpoint_host = serializers.CharField(max_length=253, required=False, allow_blank=True)
    registry_username = serializers.CharField(max_length=200, required=False, allow_blank=True)
    registry_password = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    start = serializers.BooleanField(required=False)


class ContainerRefSerializer(serializers.Serializer):
    """container.start / stop / destroy."""

    container = serializers.CharField(max_length=255)
    timeout_s = serializers.IntegerField(min_value=0, max_value=3600, required=False)


class ModelDownloadSerializer(serializers.Serializer):
    """model.download."""

    model_id = serializers.RegexField(
        MODEL_ID_RE, max_length=200, error_messages={"invalid": "Not a valid model id (expected owner/name)."}
    )
    revision = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9_./-]*$", max_length=200, required=False)
    allow_patterns = _strings(max_length=200, required=False)


class EndpointStartSerializer(serializers.Serializer):
    """endpoint.start. `endpoint_id` (the endpoint's 12-hex-digit id) is made up when left out: the
    Commands tab starts a new endpoint that way, and the same id restarts a stopped one."""

    endpoint_id = serializers.RegexField(
        ENDPOINT_ID_RE,
        required=False,
        error_messages={"invalid": "An endpoint id is 12 hex digits (leave it out to start a new endpoint)."},
    )
    model_id = serializers.RegexField(
        MODEL_ID_RE, max_length=200, error_messages={"invalid": "Not a valid model id (expected owner/name)."}
    )
    revision = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9_./-]*$", max_length=200, required=False)
    port = serializers.IntegerField(min_value=0, max_value=65535, required=False)
    gpus = serializers.IntegerField(min_value=0, max_value=64, required=False)
    min_vram_mb = serializers.IntegerField(min_value=0, required=False)
    extra_args = _strings(max_length=500, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return {"endpoint_id": uuid.uuid4().hex[:12], **attrs}


class EndpointStopSerializer(serializers.Serializer):
    """endpoint.stop."""

    endpoint_id = serializers.RegexField(NAME_RE, max_length=100)


PAYLOAD_SERIALIZERS: dict[str, type[serializers.Serializer]] = {
    "container.create": ContainerCreateSerializer,
    "container.start": ContainerRefSerializer,
    "container.stop": ContainerRefSerializer,
    "container.destroy": ContainerRefSerializer,
    "model.download": ModelDownloadSerializer,
    "endpoint.start": EndpointStartSerializer,
    "endpoint.stop": EndpointStopSerializer,
}


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def validate_payload(command_type: Any, payload: Any) -> dict[str, Any]:
    """Return the normalized payload for `command_type` or raise `ValidationError` with field messages."""
    if command_type not in PAYLOAD_SERIALIZERS:
        raise ValidationError(
            {"command_type": f"Unknown command type; choose one of {', '.join(protocol.COMMAND_TYPES)}."}
        )
    if not isinstance(payload, dict):
        raise ValidationError({"payload": "The payload must be a JSON object."})
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
    data = _plain(dict(serializer.validated_data))
    try:
        parsed = protocol.parse_payload(command_type, data)
    except protocol.ProtocolError as exc:
        raise ValidationError({"payload": str(exc)}) from None
    clean = protocol.to_dict(parsed)
    if marked:
        clean[MARKS] = marked
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

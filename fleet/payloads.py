"""Field-level validation of command payloads, one DRF serializer per command type.

`validate_payload` gives field messages (a `ValidationError` keyed by payload field) and then checks
the result against `agent.protocol.parse_payload`, so what is stored is exactly what the agent accepts.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from rest_framework import serializers

from agent import protocol

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
MODEL_ID_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$"
SECRET_FIELDS = frozenset({"registry_password"})
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
    """endpoint.start."""

    endpoint_id = serializers.RegexField(NAME_RE, max_length=100)
    model_id = serializers.RegexField(
        MODEL_ID_RE, max_length=200, error_messages={"invalid": "Not a valid model id (expected owner/name)."}
    )
    revision = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9_./-]*$", max_length=200, required=False)
    port = serializers.IntegerField(min_value=0, max_value=65535, required=False)
    gpus = serializers.IntegerField(min_value=0, max_value=64, required=False)
    min_vram_mb = serializers.IntegerField(min_value=0, required=False)
    extra_args = _strings(max_length=500, required=False)


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
    serializer = PAYLOAD_SERIALIZERS[command_type](data=payload)
    errors: dict[str, Any] = {}
    if not serializer.is_valid():
        errors.update({f"payload.{k}": v for k, v in serializer.errors.items()})
    unknown = sorted(set(payload) - set(serializer.fields))
    for name in unknown:
        errors[f"payload.{name}"] = ["Unknown field."]
    if errors:
        raise ValidationError(errors)
    data = _plain(dict(serializer.validated_data))
    try:
        parsed = protocol.parse_payload(command_type, data)
    except protocol.ProtocolError as exc:
        raise ValidationError({"payload": str(exc)}) from None
    return protocol.to_dict(parsed)


def split_secrets(payload: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Separate secret fields (stored encrypted) from the rest of the payload."""
    public = {k: v for k, v in payload.items() if k not in SECRET_FIELDS}
    secrets = {k: v for k, v in payload.items() if k in SECRET_FIELDS and v}
    return public, secrets

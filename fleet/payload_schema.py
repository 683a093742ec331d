"""API validation derived from the wire protocol: `serializer_for(payload_cls)` builds a DRF serializer from a
payload dataclass of `agent.protocol`, its type hints and its `agent.protocol.rules` field metadata.

So a command payload is defined once (in the protocol), validated once on the control plane by the derived
serializer (which drf-spectacular also turns into the OpenAPI schema) and once on the agent (`from_dict`).

Mapping: ``str`` → CharField, or RegexField with the rule's pattern and message; ``int`` / ``float`` with
min/max; ``bool``; ``Literal[...]`` → ChoiceField; ``list[str]`` → ListField of bounded strings;
``list[<dataclass>]`` → a nested serializer (many); ``dict[str, str]`` → DictField of bounded strings, keys
checked against the rule's `key_pattern`; ``dict[str, Any]`` → DictField; a nested dataclass → a nested
serializer. A field without a default is required; the validated data has every field, the dataclass's
defaults filled in (exactly what `agent.protocol.to_dict` of the parsed payload would give).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal, get_args, get_origin, get_type_hints

from rest_framework import serializers

from agent.protocol.codec import to_dict
from agent.protocol.rules import Rule, field_rules

_CACHE: dict[type, type[serializers.Serializer]] = {}


def serializer_for(
    payload_cls: type, *, fill: Mapping[str, Callable[[], Any]] | None = None
) -> type[serializers.Serializer]:
    """The DRF serializer of dataclass `payload_cls` (one class per dataclass, cached).

    `fill` (a per-command behaviour hook): fields that may be left out although the dataclass requires
    them, each made up by its callable when missing (endpoint.start's new endpoint id).
    """
    if fill is None and payload_cls in _CACHE:
        return _CACHE[payload_cls]
    fill = dict(fill or {})
    hints = get_type_hints(payload_cls)
    rules = field_rules(payload_cls)
    attrs: dict[str, Any] = {"__doc__": payload_cls.__doc__, "__module__": __name__}
    defaults: dict[str, Callable[[], Any]] = {}
    for fld in dataclasses.fields(payload_cls):  # type: ignore[arg-type]
        if not fld.init:
            continue
        default = _default_of(fld) or fill.get(fld.name)
        if default is not None:
            defaults[fld.name] = default
        attrs[fld.name] = _drf_field(hints[fld.name], rules.get(fld.name, Rule()), required=default is None)

    def validate(self: serializers.Serializer, data: dict[str, Any]) -> dict[str, Any]:
        return {name: data[name] if name in data else to_dict(defaults[name]()) for name in self.fields}

    attrs["validate"] = validate
    name = payload_cls.__name__.removesuffix("Payload") + "Serializer"
    built: type[serializers.Serializer] = type(name, (serializers.Serializer,), attrs)
    if not fill:
        _CACHE[payload_cls] = built
    return built


def payload_field(payload_cls: type, name: str, **overrides: Any) -> serializers.Field:
    """Field `name` of dataclass `payload_cls` as its own DRF field, built as `serializer_for` builds it (type,
    bounds, pattern and message from its rule), with the dataclass's default: for an API input that carries
    a payload's field without being that payload (an endpoint's model, revision, GPUs and VRAM go into every
    endpoint.start it sends). `overrides` (`required`, `validators`, `help_text`...) go to the field."""
    fld = next(f for f in dataclasses.fields(payload_cls) if f.name == name)  # type: ignore[arg-type]
    default = _default_of(fld)
    kwargs: dict[str, Any] = {"default": default} if default is not None else {}
    kwargs.update(overrides)
    required = kwargs.pop("required", default is None)
    if required:
        kwargs.pop("default", None)
    hint = get_type_hints(payload_cls)[name]
    return _drf_field(hint, field_rules(payload_cls).get(name, Rule()), required=required, **kwargs)


def _default_of(fld: dataclasses.Field) -> Callable[[], Any] | None:
    if fld.default_factory is not dataclasses.MISSING:
        return fld.default_factory
    if fld.default is not dataclasses.MISSING:
        value = fld.default
        return lambda: value
    return None


def _drf_field(hint: Any, found: Rule, *, required: bool, **extra: Any) -> serializers.Field:
    kwargs: dict[str, Any] = {"required": required, **extra}
    origin = get_origin(hint)
    if origin is Literal:
        return serializers.ChoiceField(choices=list(get_args(hint)), **kwargs)
    if hint is bool:
        return serializers.BooleanField(**kwargs)
    if hint is int:
        return serializers.IntegerField(min_value=found.min, max_value=found.max, **kwargs)
    if hint is float:
        return serializers.FloatField(min_value=found.min, max_value=found.max, **kwargs)
    if hint is str:
        return _string(found, **kwargs)
    if origin is list:
        (item,) = get_args(hint)
        if dataclasses.is_dataclass(item):
            return serializer_for(item)(many=True, max_length=found.items_max, **kwargs)
        child = serializers.CharField(max_length=found.item_max_length, allow_blank=True, trim_whitespace=found.strip)
        return serializers.ListField(child=child, max_length=found.items_max, **kwargs)
    if origin is dict:
        _, value = get_args(hint)
        if found.key_pattern is not None:
            kwargs["validators"] = [_KeyCheck(found.key_pattern, found.message), *kwargs.get("validators", ())]
        if value is str:
            child = serializers.CharField(
                max_length=found.item_max_length, allow_blank=True, trim_whitespace=found.strip
            )
            return serializers.DictField(child=child, **kwargs)
        return serializers.DictField(**kwargs)
    if dataclasses.is_dataclass(hint):
        return serializer_for(hint)(**kwargs)  # type: ignore[arg-type]
    raise TypeError(f"no API field for payload type {hint!r}")


def _string(found: Rule, **kwargs: Any) -> serializers.Field:
    if found.choices:
        return serializers.ChoiceField(choices=list(found.choices), allow_blank=found.blank, **kwargs)
    common = {"max_length": found.max_length, "allow_blank": found.blank, "trim_whitespace": found.strip}
    if found.pattern is None:
        return serializers.CharField(**common, **kwargs)
    messages = {"invalid": found.message} if found.message else {}
    return serializers.RegexField(found.pattern, error_messages=messages, **common, **kwargs)


class _KeyCheck:
    """A mapping's keys must match `pattern`; the message names the bad ones."""

    def __init__(self, pattern: str, message: str) -> None:
        self.pattern, self.message = pattern, message or "Bad key(s)"

    def __call__(self, value: dict[str, Any]) -> None:
        bad = sorted(k for k in value if not re.fullmatch(self.pattern, k))
        if bad:
            raise serializers.ValidationError(f"{self.message}: {', '.join(bad)}")


def plain(value: Any) -> Any:
    """DRF's validated data (ordered dicts, nested) as plain dicts and lists."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value

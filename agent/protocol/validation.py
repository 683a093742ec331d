"""Typed validation of decoded JSON: `from_dict` builds a dataclass checking every field against its type hints
and its `agent.protocol.rules` rule (bounds, patterns).

Used by the codec for frames, by `parse_payload` for command payloads and, leniently, by `parse_result` for
command results; `nesting_exceeds` bounds depth.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from agent.protocol.rules import check_rule, field_rules
from agent.protocol.versions import ProtocolError

T = TypeVar("T")


def nesting_exceeds(value: Any, limit: int) -> bool:
    """True when `value` has objects/lists nested more than `limit` deep (itself counts as 1).

    Iterative, so it cannot itself hit the recursion limit, and it stops at the first path too deep.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def from_dict(cls: type[T], data: Any, *, where: str, lenient: bool = False) -> T:
    """Build dataclass `cls` from `data`, checking every field's type and rule; `ProtocolError` otherwise.

    `lenient` (for what a peer reports rather than what it asks): unknown fields are ignored and a field
    whose value does not fit its type or rule reads as absent (its default), at every nesting level.
    """
    if not isinstance(data, dict):
        raise ProtocolError(f"{where} must be an object")
    hints = _hints(cls)
    rules = field_rules(cls)
    known = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
    unknown = set(data) - set(known)
    if unknown and not lenient:
        raise ProtocolError(f"{where} has unknown field(s): {', '.join(sorted(unknown))}")
    kwargs: dict[str, Any] = {}
    for name, fld in known.items():
        required = fld.default is dataclasses.MISSING and fld.default_factory is dataclasses.MISSING
        if name in data:
            try:
                value = _coerce(hints[name], data[name], where=f"{where}.{name}", lenient=lenient)
                if name in rules:
                    check_rule(rules[name], value, where=f"{where}.{name}")
            except ProtocolError:
                if not lenient or required:
                    raise
                continue
            kwargs[name] = value
        elif required:
            raise ProtocolError(f"{where} is missing required field {name!r}")
    return cls(**kwargs)


_HINT_CACHE: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINT_CACHE:
        _HINT_CACHE[cls] = get_type_hints(cls)
    return _HINT_CACHE[cls]


def _coerce(hint: Any, value: Any, *, where: str, lenient: bool = False) -> Any:
    origin = get_origin(hint)
    if origin is Literal:
        if value not in get_args(hint):
            raise ProtocolError(f"{where} must be one of {', '.join(map(repr, get_args(hint)))}")
        return value
    if origin in (Union, types.UnionType):
        options = get_args(hint)
        if value is None and type(None) in options:
            return None
        last_error: ProtocolError | None = None
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(option, value, where=where, lenient=lenient)
            except ProtocolError as exc:
                last_error = exc
        raise last_error or ProtocolError(f"{where} has the wrong type")
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError(f"{where} must be a list")
        (item_hint,) = get_args(hint) or (Any,)
        return [_coerce(item_hint, item, where=f"{where}[{i}]", lenient=lenient) for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where} must be an object")
        key_hint, value_hint = get_args(hint) or (str, Any)
        return {
            _coerce(key_hint, k, where=f"{where} key"): _coerce(value_hint, v, where=f"{where}[{k!r}]", lenient=lenient)
            for k, v in value.items()
        }
    if hint is Any or hint is typing.Any:
        return value
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, where=where, lenient=lenient)
    if hint is bool:
        if not isinstance(value, bool):
            raise ProtocolError(f"{where} must be a boolean")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"{where} must be an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProtocolError(f"{where} must be a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ProtocolError(f"{where} must be a string")
        return value
    raise ProtocolError(f"{where}: unsupported field type {hint!r}")  # pragma: no cover - programming error

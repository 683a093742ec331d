"""Field rules of wire messages: bounds, patterns and messages carried as dataclass field metadata.

A payload field is declared once, e.g. ``name: str = field(metadata=rule(max_length=128, pattern=NAME_RE))``;
`agent.protocol.validation.from_dict` enforces the rule on the agent, and the control plane derives its
API validation (and the OpenAPI schema) from the same metadata (`fleet.payload_schema.serializer_for`).

Semantics (both sides): a string field refuses "" unless `blank` is set or its default is ""; `max_length`
bounds its length and `pattern` (anchored, ``^...$``) must match all of it (a blank value skips the pattern);
numbers lie within `min`..`max`; a list holds at most `items_max` items; list items and mapping values are
strings of at most `item_max_length` (blank allowed); mapping keys match `key_pattern`. `message` replaces
the generic text of a pattern failure. `strip` (on by default) lets the API trim surrounding whitespace of
strings before checking them, as Django REST framework does; the agent receives the trimmed value.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from agent.protocol.versions import ProtocolError

# Patterns shared by several payloads (anchored: they also go verbatim into the OpenAPI schema).
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"  # container names, Ray cluster/member/submission ids
ENDPOINT_ID_RE = r"^[0-9a-f]{12}$"
MODEL_ID_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$"
REVISION_RE = r"^[A-Za-z0-9][A-Za-z0-9_./-]*$"
RAY_VERSION_RE = r"^[0-9]+\.[0-9]+\.[0-9]+$"
HOST_RE = r"^[A-Za-z0-9][A-Za-z0-9.:-]*$"  # an in-cluster Service's host name, or an IP address
HEAD_ADDRESS_RE = r"^[A-Za-z0-9_.:\[\]-]+:[0-9]{1,5}$"
RAY_NODE_ID_RE = r"^[0-9a-fA-F]+$"
KUBE_NAME_RE = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # a Kubernetes object name (RFC 1123 label)
ADAPTER_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
ADAPTER_MODEL_ID_RE = r"^$|" + MODEL_ID_RE  # empty when the adapter is a path on the node
# an absolute directory on the node, no `..` part (empty when the adapter is a Hub repository)
ADAPTER_PATH_RE = r"^$|^/(?!.*(^|/)\.\.(/|$))[A-Za-z0-9_./-]*$"
FILE_NAME_RE = r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$"
LOCAL_PATH_RE = r"^(/[A-Za-z0-9_][A-Za-z0-9_.+-]*)+/?$"  # an absolute folder, no '..', no blanks
AGENT_VERSION_RE = r"^[A-Za-z0-9.+_-]{1,100}$"
SHA256_HEX_RE = r"^[0-9a-f]{64}$"
MAX_ITEMS = 64  # the longest list a payload field holds

RULE = "rule"  # the metadata key


@dataclass(frozen=True)
class Rule:
    """The checks of one field (see the module docstring); None/empty means unchecked."""

    min: float | None = None
    max: float | None = None
    max_length: int | None = None
    blank: bool = False
    pattern: str | None = None
    choices: tuple[str, ...] = ()
    items_max: int | None = None
    item_max_length: int | None = None
    key_pattern: str | None = None
    message: str = ""
    strip: bool = True


def rule(
    *,
    min: float | None = None,
    max: float | None = None,
    max_length: int | None = None,
    blank: bool = False,
    pattern: str | None = None,
    choices: tuple[str, ...] = (),
    items_max: int | None = None,
    item_max_length: int | None = None,
    key_pattern: str | None = None,
    message: str = "",
    strip: bool = True,
    since: int | None = None,
) -> dict[str, Any]:
    """Field metadata holding a `Rule` (and, with `since`, the protocol version the field appeared in)."""
    found = Rule(
        min=min,
        max=max,
        max_length=max_length,
        blank=blank,
        pattern=pattern,
        choices=tuple(choices),
        items_max=items_max,
        item_max_length=item_max_length,
        key_pattern=key_pattern,
        message=message,
        strip=strip,
    )
    return {RULE: found} if since is None else {RULE: found, "since": since}


_FIELD_RULES: dict[type, dict[str, Rule]] = {}


def field_rules(cls: type) -> dict[str, Rule]:
    """The effective rule of each field of dataclass `cls` that has one: a string field whose default is ""
    accepts "" (its default must always pass)."""
    if cls not in _FIELD_RULES:
        rules: dict[str, Rule] = {}
        for fld in dataclasses.fields(cls):  # type: ignore[arg-type]
            found = fld.metadata.get(RULE)
            if found is None:
                continue
            if fld.default == "" and not found.blank:
                found = dataclasses.replace(found, blank=True)
            rules[fld.name] = found
        _FIELD_RULES[cls] = rules
    return _FIELD_RULES[cls]


def check_rule(found: Rule, value: Any, *, where: str) -> None:
    """Raise `ProtocolError` when the (type-checked) `value` breaks `found`."""
    if isinstance(value, str):
        _check_string(found, value, where=where)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if found.min is not None and value < found.min:
            raise ProtocolError(f"{where} must be at least {_number(found.min)}")
        if found.max is not None and value > found.max:
            raise ProtocolError(f"{where} must be at most {_number(found.max)}")
    elif isinstance(value, list):
        if found.items_max is not None and len(value) > found.items_max:
            raise ProtocolError(f"{where} holds more than {found.items_max} items")
        for i, item in enumerate(value):
            _check_item(found, item, where=f"{where}[{i}]")
    elif isinstance(value, dict):
        if found.items_max is not None and len(value) > found.items_max:
            raise ProtocolError(f"{where} holds more than {found.items_max} items")
        if found.key_pattern is not None:
            bad = sorted(k for k in value if not re.fullmatch(found.key_pattern, k))
            if bad:
                text = found.message or "bad key(s)"
                raise ProtocolError(f"{where}: {text}: {', '.join(bad)}")
        for key, item in value.items():
            _check_item(found, item, where=f"{where}[{key!r}]")


def _check_string(found: Rule, value: str, *, where: str) -> None:
    if value == "":
        if not found.blank:
            raise ProtocolError(f"{where} may not be blank")
        return
    if found.max_length is not None and len(value) > found.max_length:
        raise ProtocolError(f"{where} is longer than {found.max_length} characters")
    if found.choices and value not in found.choices:
        raise ProtocolError(f"{where} must be one of {', '.join(map(repr, found.choices))}")
    if found.pattern is not None and not re.fullmatch(found.pattern, value):
        raise ProtocolError(f"{where}: {found.message or 'does not match ' + found.pattern}")


def _check_item(found: Rule, item: Any, *, where: str) -> None:
    if found.item_max_length is not None and isinstance(item, str) and len(item) > found.item_max_length:
        raise ProtocolError(f"{where} is longer than {found.item_max_length} characters")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)

"""The generic filterset the API and the pages share (django-filter is not installed).

A `FilterSet` names `Filter`s: each parses one query parameter (`as_uuid`, `choice`, `text`, `boolean`:
each parser carries the OpenAPI schema of what it accepts) and filters on an ORM lookup or a `Q` built
from the value. The apps declare their own filtersets from these.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet


def as_uuid(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ValidationError("Must be a UUID.") from None


as_uuid.schema = {"type": "string", "format": "uuid"}  # type: ignore[attr-defined]  (its OpenAPI schema)


def choice(values: list[str]) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value not in values:
            raise ValidationError(f"Choose one of {', '.join(values)}.")
        return value

    parse.schema = {"type": "string", "enum": list(values)}  # type: ignore[attr-defined]
    return parse


def text(max_length: int = 100) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if len(value) > max_length:
            raise ValidationError(f"At most {max_length} characters.")
        return value

    parse.schema = {"type": "string", "maxLength": max_length}  # type: ignore[attr-defined]
    return parse


def boolean(value: str) -> bool:
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ValidationError("Must be true or false.")


@dataclass(frozen=True)
class Filter:
    """A query parameter: how to parse it and which ORM lookup it filters on (or a `Q` built from it)."""

    lookup: str | Callable[[Any], Q]
    parse: Callable[[str], Any]

    @property
    def schema(self) -> dict[str, Any]:
        """The parameter's OpenAPI schema (what its parser accepts), for the API docs."""
        return dict(getattr(self.parse, "schema", {"type": "string"}))


class FilterSet:
    """Named filters applied from query parameters; bad values raise `ValidationError` per parameter."""

    def __init__(self, **filters: Filter) -> None:
        self.filters = filters

    def apply(self, queryset: QuerySet, params: Mapping[str, str]) -> QuerySet:
        errors: dict[str, str] = {}
        lookups: dict[str, Any] = {}
        conditions = Q()
        for name, flt in self.filters.items():
            raw = params.get(name)
            if raw in (None, ""):
                continue
            if "\x00" in raw:  # PostgreSQL cannot hold it: refuse it here, not as a database error
                errors[name] = "Null characters are not allowed."
                continue
            try:
                value = flt.parse(raw)
            except ValidationError as exc:
                errors[name] = exc.messages[0]
                continue
            if callable(flt.lookup):
                conditions &= flt.lookup(value)
            else:
                lookups[flt.lookup] = value
        if errors:
            raise ValidationError(errors)
        return queryset.filter(conditions, **lookups)

"""The OpenAPI schema's shared rules (drf-spectacular): the error answers every operation can give and
the query filters of list operations, so that /api/schema/ describes what the server really answers.

Error bodies, as the views produce them (`kernel.api`):
- 400 `FieldErrors`: each key a field (payload fields as `payload.<name>`, `non_field_errors` for the
  body as a whole, a query parameter's name for a bad filter or page bound) with its messages; a body
  that is not JSON gives `{"detail": ...}`.
- 403, 404, 409, 429 `Error`: `{"detail": ...}`, with `code` for refused join tokens and placement
  refusals (and then `error_help`). 403 is also the answer without credentials (session auth first).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema as SpectacularAutoSchema
from drf_spectacular.utils import OpenApiParameter
from rest_framework import serializers

from kernel.api import MAX_PAGE_LIMIT, MAX_PAGE_OFFSET

FIELD_ERRORS = {
    "type": "object",
    "description": (
        "Field errors: each key names a field (`payload.<name>` for a command payload's fields, "
        "`non_field_errors` for the body as a whole, the parameter for a bad query value) and holds its "
        'messages. A body that is not valid JSON answers `{"detail": "JSON parse error - ..."}`.'
    ),
    "additionalProperties": {
        "anyOf": [{"type": "array", "items": {}}, {"type": "string"}, {"type": "object"}],
    },
    "example": {"payload.image": ["This field is required."], "node_id": ["No such node in this cluster."]},
}
ERROR = {
    "type": "object",
    "description": "Why the request was refused.",
    "properties": {
        "detail": {"type": "string"},
        "code": {"type": "string", "description": "A machine-readable reason, where there is one."},
        "error_help": {
            "type": "object",
            "nullable": True,
            "additionalProperties": {"type": "string"},
            "description": "What the code means and what to do (placement refusals).",
        },
    },
    "required": ["detail"],
}
COMPONENTS = {"FieldErrors": FIELD_ERRORS, "Error": ERROR}

_WHY = {
    "400": "Invalid input: field messages.",
    "403": "Not signed in, or the caller's role does not allow this.",
    "404": "No such object in the caller's workspaces.",
    "409": "The object's state does not allow this now.",
    "429": "Too many requests from this client: retry after `Retry-After` seconds.",
}
_WRITES = {"POST", "PUT", "PATCH", "DELETE"}
# Query parameters that an empty value does not leave out (every other one, empty, is as good as absent).
VALUED_QUERY = {"format"}


def _error(code: str) -> dict[str, Any]:
    component = "FieldErrors" if code == "400" else "Error"
    response: dict[str, Any] = {
        "description": _WHY[code],
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{component}"}}},
    }
    if code == "429":
        response["headers"] = {
            "Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait before retrying."}
        }
    return response


def add_components(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular post-processing hook: the error bodies the operations refer to."""
    result.setdefault("components", {}).setdefault("schemas", {}).update(COMPONENTS)
    return result


def filter_parameters(filterset: Any) -> list[OpenApiParameter]:
    """The query parameters of a `kernel.filters.FilterSet`, with the schema each parser accepts."""
    return [query(name, flt.schema, f"Filter on `{name}`.") for name, flt in filterset.filters.items()]


def query(name: str, schema: dict[str, Any], description: str) -> OpenApiParameter:
    """An optional query parameter (a list filter or a switch)."""
    return OpenApiParameter(name, schema, required=False, description=description)


UUID = {"type": "string", "format": "uuid"}
# `limit`/`offset` of actions that page by hand (list actions get them from the paginator)
PAGING = [
    query("limit", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_LIMIT}, "Rows per page."),
    query("offset", {"type": "integer", "minimum": 0, "maximum": MAX_PAGE_OFFSET}, "Rows to skip."),
]


class AutoSchema(SpectacularAutoSchema):
    """drf-spectacular's AutoSchema plus the project's rules: list filters from the view's `filterset`,
    and the error answers the views give (400, 403, 404, 409, 429) on every operation they apply to.

    A view may list extra codes per action in `schema_errors = {"action": ("409",)}`.
    """

    def get_override_parameters(self) -> list[Any]:
        parameters = list(super().get_override_parameters())
        filterset = getattr(self.view, "filterset", None)
        if filterset is not None and getattr(self.view, "action", None) == "list":
            parameters.extend(filter_parameters(filterset))
        return parameters

    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        operation = super().get_operation(*args, **kwargs)
        if operation is None:
            return None
        for parameter in operation.get("parameters", []):
            if parameter["in"] == "query" and parameter["name"] not in VALUED_QUERY:
                parameter["allowEmptyValue"] = True
        responses = operation.setdefault("responses", {})
        for code in sorted(self._error_codes(operation)):
            responses.setdefault(code, _error(code))
        return operation

    def _error_codes(self, operation: dict[str, Any]) -> set[str]:
        action = getattr(self.view, "action", None)
        has_path_params = "{" in self.path
        queries = [p for p in operation.get("parameters", []) if p.get("in") == "query"]
        codes = {"403"}
        if "requestBody" in operation or queries or self.method in _WRITES:
            codes.add("400")
        if has_path_params or action == "create":
            codes.add("404")
        if has_path_params and self.method in _WRITES - {"PATCH", "PUT"}:
            codes.add("409")
        if getattr(self.view, "throttle_classes", None):
            codes.add("429")
        codes.update(getattr(self.view, "schema_errors", {}).get(action, ()))
        return codes


def page_of(serializer_class: type[serializers.Serializer]) -> type[serializers.Serializer]:
    """The schema of one `Pagination` page of `serializer_class` rows (for actions that page by hand)."""
    name = serializer_class.__name__.removesuffix("Serializer") + "Page"
    return type(
        name,
        (serializers.Serializer,),
        {
            "__doc__": "A page of rows (`limit`/`offset`); `next`/`previous` link the neighbouring pages.",
            "__module__": __name__,
            "count": serializers.IntegerField(),
            "next": serializers.URLField(allow_null=True),
            "previous": serializers.URLField(allow_null=True),
            "results": serializer_class(many=True),
        },
    )

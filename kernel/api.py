"""Small helpers shared by every app's API views: the JSON parser, paging, errors, JSON answers for
unknown /api/ URLs and for query strings PostgreSQL cannot hold."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect, JsonResponse
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, pagination, parsers, serializers, status
from rest_framework.response import Response

from agent.protocol import nesting_exceeds
from kernel.exceptions import IllegalTransition, QuotaExceeded

# Request bodies nested deeper than this are refused (400) before any code walks them recursively.
MAX_JSON_NESTING = 64


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, with bodies nested too deeply (for Python's parser or our own walkers) a 400
    with a reason instead of a RecursionError and a 500."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError(f"JSON parse error - nested deeper than {MAX_JSON_NESTING} levels") from None
        if nesting_exceeds(data, MAX_JSON_NESTING):
            raise exceptions.ParseError(f"JSON parse error - nested deeper than {MAX_JSON_NESTING} levels")
        return data


# Paging bounds: `limit` 1..MAX_PAGE_LIMIT, `offset` 0..MAX_PAGE_OFFSET; outside them (or not a number) a 400.
MAX_PAGE_LIMIT = 1000
MAX_PAGE_OFFSET = 2**31 - 1
_DIGITS = re.compile(r"^[0-9]{1,12}$")


class Pagination(pagination.LimitOffsetPagination):
    """`?limit=` / `?offset=` paging whose bad values are a 400 with the parameter's message (DRF's own
    ignores them, and a huge number reached PostgreSQL as an out-of-range OFFSET: a 500)."""

    max_limit = MAX_PAGE_LIMIT

    def _bounded(self, request: Any, name: str, low: int, high: int, default: int | None) -> int | None:
        raw = request.query_params.get(name)
        if raw in (None, ""):
            return default
        value = int(raw) if _DIGITS.match(raw) else None
        if value is None or not low <= value <= high:
            raise exceptions.ValidationError({name: [f"Must be a whole number from {low} to {high}."]})
        return value

    def get_limit(self, request: Any) -> int | None:
        return self._bounded(request, self.limit_query_param, 1, MAX_PAGE_LIMIT, self.default_limit)

    def get_offset(self, request: Any) -> int:
        return self._bounded(request, self.offset_query_param, 0, MAX_PAGE_OFFSET, 0) or 0

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        bounds = {self.limit_query_param: (1, MAX_PAGE_LIMIT), self.offset_query_param: (0, MAX_PAGE_OFFSET)}
        for parameter in parameters:
            low, high = bounds[parameter["name"]]
            parameter["schema"] = {**parameter["schema"], "minimum": low, "maximum": high}
        return parameters


@csrf_exempt  # an unknown URL is a 404 whatever the method and cookies
def api_not_found(request: HttpRequest, unmatched: str = "") -> HttpResponse:
    """Any /api/ URL no route matches: a JSON 404 (or, like APPEND_SLASH, a redirect to the same path
    with its trailing slash when that one exists)."""
    if not request.path.endswith("/"):
        try:
            match = resolve(request.path + "/")
        except Resolver404:
            match = None
        if match is not None and match.func is not api_not_found:
            query_string = request.META.get("QUERY_STRING", "")
            target = request.path + "/" + (f"?{query_string}" if query_string else "")
            return HttpResponsePermanentRedirect(target, status=301 if request.method in ("GET", "HEAD") else 308)
    return JsonResponse({"detail": "Not found."}, status=404)


class RejectNulQueryMiddleware:
    """A NUL character in an /api/ query string is a 400 naming the parameter: PostgreSQL cannot store or
    compare it, so the filters that pass it on would fail with a database error (a 500)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith("/api/"):
            bad = sorted({k for k, values in request.GET.lists() for v in [k, *values] if "\x00" in v})
            if bad:
                return JsonResponse({name: ["Null characters are not allowed."] for name in bad}, status=400)
        return self.get_response(request)


class NoUnknownFields(serializers.Serializer):
    """A request body serializer that refuses names it does not know (400 `{"<name>": ["Unknown field."]}`)
    instead of dropping them: a misspelt limit must not answer 200 and change nothing."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: "Unknown field." for name in unknown})
        return attrs


def validated(serializer_class: type, data: Any, **kwargs: Any) -> dict[str, Any]:
    """Validate a request body with `serializer_class`; 400 with field messages (or a non-object body)."""
    if not isinstance(data, dict):
        raise exceptions.ValidationError({"non_field_errors": ["Expected a JSON object."]})
    serializer = serializer_class(data=data, **kwargs)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


class Conflict(exceptions.APIException):
    """HTTP 409: a state machine refused the change."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"
    default_detail = "The change conflicts with the current state."


def validation_detail(exc: DjangoValidationError) -> Any:
    """A Django ValidationError as DRF field messages (`non_field_errors` when it names no field)."""
    if hasattr(exc, "error_dict"):
        return exc.message_dict
    return {"non_field_errors": exc.messages}


class ServiceErrorsMixin:
    """Turn service exceptions into API answers, never a 500: Django's ValidationError → 400 with field
    messages, PermissionDenied → 403 with its reason, IllegalTransition → 409.

    A viewset with exceptions of its own overrides `translate_exception` and calls super() for the rest.
    """

    def translate_exception(self, exc: Exception) -> Exception | Response:
        if isinstance(exc, DjangoValidationError):
            return exceptions.ValidationError(validation_detail(exc))
        if isinstance(exc, DjangoPermissionDenied):
            return exceptions.PermissionDenied(str(exc) or None)
        if isinstance(exc, QuotaExceeded):  # 409 naming the quota, its limit, what is in use and asked
            return Response({"detail": str(exc), **exc.as_dict()}, status=status.HTTP_409_CONFLICT)
        if isinstance(exc, IllegalTransition):
            return Conflict(str(exc))
        return exc

    def handle_exception(self, exc: Exception) -> Response:
        translated = self.translate_exception(exc)
        if isinstance(translated, Response):
            return translated
        return super().handle_exception(translated)  # type: ignore[misc]

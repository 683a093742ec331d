"""Small helpers shared by every app's API views."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import exceptions, parsers, status
from rest_framework.response import Response

from agent.protocol import nesting_exceeds
from fleet.exceptions import IllegalTransition

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
        if isinstance(exc, IllegalTransition):
            return Conflict(str(exc))
        return exc

    def handle_exception(self, exc: Exception) -> Response:
        translated = self.translate_exception(exc)
        if isinstance(translated, Response):
            return translated
        return super().handle_exception(translated)  # type: ignore[misc]

"""Small helpers shared by every app's API views."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions


def validated(serializer_class: type, data: Any, **kwargs: Any) -> dict[str, Any]:
    """Validate a request body with `serializer_class`; 400 with field messages (or a non-object body)."""
    if not isinstance(data, dict):
        raise exceptions.ValidationError({"non_field_errors": ["Expected a JSON object."]})
    serializer = serializer_class(data=data, **kwargs)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)

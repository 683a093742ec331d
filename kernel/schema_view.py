"""The OpenAPI document's view, kept apart from `kernel.schema` (which drf-spectacular's views module imports
through DEFAULT_SCHEMA_CLASS, so it cannot import that module back)."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from django.utils import translation
from drf_spectacular.views import SpectacularAPIView
from rest_framework.response import Response


class CachedSchemaView(SpectacularAPIView):
    """/api/schema/: the OpenAPI document, generated and rendered once per process and kept (it depends only
    on the code, never on the caller: it is served public). Generating it walks every view and serializer
    (0.2-0.9 s and a dozen queries here) and rendering it as YAML takes 0.5 s more: /api/docs/ fetches it on
    every visit."""

    _schemas: ClassVar[dict[tuple[str | None, str], Any]] = {}
    _rendered: ClassVar[dict[tuple[str | None, str, str], tuple[bytes, str]]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def finalize_response(self, request: Any, response: Any, *args: Any, **kwargs: Any) -> Any:
        """Render the document once per version, language and format; later answers reuse the bytes."""
        response = super().finalize_response(request, response, *args, **kwargs)
        if response.status_code != 200 or getattr(response, "accepted_renderer", None) is None:
            return response
        version = self.api_version or request.version or self._get_version_parameter(request)
        key = (version, translation.get_language() or "", response.accepted_media_type)
        with self._lock:
            if key not in self._rendered:
                response.render()
                self._rendered[key] = (response.content, response["Content-Type"])
        response.content, response["Content-Type"] = self._rendered[key]  # marks the response rendered
        return response

    def _get_schema_response(self, request: Any) -> Response:
        version = self.api_version or request.version or self._get_version_parameter(request)
        key = (version, translation.get_language() or "")
        with self._lock:  # one generation at a time; the others wait for it and share it
            if key not in self._schemas:
                generator = self.generator_class(urlconf=self.urlconf, api_version=version, patterns=self.patterns)
                self._schemas[key] = generator.get_schema(request=request, public=True)
        filename = self._get_filename(request, version)
        return Response(data=self._schemas[key], headers={"Content-Disposition": f'inline; filename="{filename}"'})

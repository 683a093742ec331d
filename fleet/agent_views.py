"""What nodes download from the control plane: the install script and the agent package."""

from __future__ import annotations

import threading
from pathlib import Path

from django.conf import settings
from django.http import FileResponse, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from agent.install import build_agent_sdist, render_install_script

_sdist_lock = threading.Lock()
_built: dict[str, Path] = {}


def control_plane_url(request: HttpRequest) -> str:
    """The URL nodes should use: CONTROL_PLANE_URL when configured, else the one this request came to."""
    configured = getattr(settings, "CONTROL_PLANE_URL_EXPLICIT", "")
    return configured or request.build_absolute_uri("/").rstrip("/")


@require_GET
def install_script(request: HttpRequest) -> HttpResponse:
    """`curl -fsSL <url>/agent/install.sh | CLUSTER_TOKEN=… sh`: the installer with this control plane's URL."""
    script = render_install_script(control_plane_url(request))
    return HttpResponse(script, content_type="text/x-shellscript; charset=utf-8")


@require_GET
def agent_package(request: HttpRequest) -> FileResponse:
    """The agent sdist that install.sh pip-installs; built once per process from this checkout."""
    with _sdist_lock:
        if "sdist" not in _built or not _built["sdist"].exists():
            cache_dir = Path(settings.AGENT_PACKAGE_CACHE_DIR)
            _built["sdist"] = build_agent_sdist(project_dir=settings.BASE_DIR, output_dir=cache_dir)
        path = _built["sdist"]
    return FileResponse(path.open("rb"), as_attachment=True, filename="package.tar.gz")

"""What nodes download from the control plane: the install script and the agent package."""

from __future__ import annotations

from django.conf import settings
from django.http import FileResponse, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from agent.install import render_install_script
from fleet import agent_packages


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
    """The agent sdist that install.sh pip-installs and `agent.update` installs (`fleet.agent_packages`)."""
    package = agent_packages.served_package()
    response = FileResponse(package.path.open("rb"), as_attachment=True, filename="package.tar.gz")
    response["X-Agent-Version"] = package.version
    response["X-Agent-SHA256"] = package.sha256
    return response

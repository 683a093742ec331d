"""Which Ray releases a cluster may run: settings.RAY_VERSIONS (docker), the agent's own Ray (process)."""

from __future__ import annotations

from django.conf import settings

from raymgr.models import RayRuntime, default_ray_version


def offered_versions(runtime: str) -> list[str]:
    """The Ray versions a new cluster of `runtime` can be created with (the default first)."""
    if runtime == RayRuntime.PROCESS:
        return [settings.RAY_PROCESS_VERSION]
    return list(settings.RAY_VERSIONS)


def default_version(runtime: str) -> str:
    """The version a cluster of `runtime` gets when none is chosen."""
    return settings.RAY_PROCESS_VERSION if runtime == RayRuntime.PROCESS else default_ray_version()


def version_error(runtime: str, version: object) -> str:
    """Why `version` cannot run with `runtime` ('' when it can)."""
    offered = offered_versions(runtime)
    if isinstance(version, str) and version in offered:
        return ""
    if runtime == RayRuntime.PROCESS:
        return (
            f"The process runtime runs the Ray installed next to the agent ({offered[0]}); "
            "choose that version or the docker runtime."
        )
    return f"Choose one of the offered Ray versions: {', '.join(offered)}."

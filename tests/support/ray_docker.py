"""The docker runtime's Ray containers in end-to-end tests: the image `.ci/ray-image` builds, the agent
environment that puts Ray containers on Podman's Docker API, and the containers a Ray cluster has."""

from __future__ import annotations

from tests.agent.executors.podman import require_podman
from tests.support.environment import missing
from tests.support.node_container import podman

VERSION = "2.9.0"  # the documented default (RAY_VERSIONS' first)


def containers_of(cluster_id) -> list[str]:
    """Names of the Ray containers (any state) labelled with Ray cluster `cluster_id`."""
    listed = podman("ps", "-a", "--format", "{{.Names}}", "--filter", f"label=cleverthis.ray.cluster={cluster_id}")
    return listed.stdout.split()


def ray_container_env() -> dict[str, str]:
    """An agent's environment for Ray containers on Podman's Docker API; skips without Podman or the image."""
    url = require_podman()
    if podman("image", "exists", f"docker.io/rayproject/ray:{VERSION}", check=False).returncode != 0:
        missing(f"no rayproject/ray:{VERSION} image", "run .ci/ray-image (as root) to build it")
    return {"DOCKER_HOST": url, "CLEVERTHIS_RAY_MEMORY": "3g", "CLEVERTHIS_RAY_SHM_SIZE": "768m"}


def remove_containers(cluster_ids: list[str]) -> None:
    """Force-remove whatever containers these Ray clusters still have."""
    for cluster_id in cluster_ids:
        for name in containers_of(cluster_id):
            podman("rm", "-f", "-t", "1", name, check=False)


def ray_errors(container: str, lines: int = 30) -> str:
    """The last error lines of the Ray logs in `container` (raylet, GCS, workers): why a workload died."""
    done = podman(
        "exec",
        container,
        "sh",
        "-c",
        "cd /tmp/ray/session_latest/logs && grep -H -E "
        '" E |Error|OOM|memory|Killed|already in use|UNHEALTHY|Didn\'t receive" '
        f"raylet.out gcs_server.out *.err serve/*.log 2>/dev/null | grep -v 'thirdparty_files' | tail -n {lines}",
        check=False,
    )
    return done.stdout[-6000:] or done.stderr[-1000:]

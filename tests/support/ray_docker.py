"""The docker runtime's Ray containers in tests, on Podman's Docker API.

For agents in process (`tests/agent/ray/test_ray_docker.py`, `tests/agent/workloads/test_ray_container_ranks.py`):
``engine_with(image, how)`` skips without Podman or the image and gives the engine's URL; ``ray_hosts(url,
tmp_path, memory=..., shm=...)`` makes the Ray command handlers of two hosts (host-0, host-1) on it;
``head_payload(...)`` and ``worker_payload(head, ...)`` are their ``ray.head.start`` / ``ray.worker.start``
payloads; ``remove_members(ids)`` removes what they left. For real agents (tests/e2e): the image
`.ci/ray-image` builds, the agent environment that puts Ray containers on Podman's Docker API
(``ray_container_env``), and the containers a Ray cluster has (``containers_of``, ``remove_containers``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.ray.commands import RayCommandHandler
from agent.ray.containers import DockerRayContainers
from agent.ray.members import member_name
from agent.ray.ports import free_port
from tests.agent.executors.podman import require_podman
from tests.support.environment import missing
from tests.support.node_container import podman

VERSION = "2.9.0"  # the documented default (RAY_VERSIONS' first)


def containers_of(cluster_id) -> list[str]:
    """Names of the Ray containers (any state) labelled with Ray cluster `cluster_id`."""
    listed = podman("ps", "-a", "--format", "{{.Names}}", "--filter", f"label=cleverthis.ray.cluster={cluster_id}")
    return listed.stdout.split()


def engine_with(image: str, build: str) -> str:
    """Podman's Docker API URL, where `image` is present; skips (`missing`) without Podman or the image, which
    the script `build` makes."""
    url = require_podman()
    if podman("image", "exists", image, check=False).returncode != 0:
        missing(f"no {image.removeprefix('docker.io/')} image", f"run {build} (as root) to build it")
    return url


def ray_hosts(engine_url: str, work_dir: Path, *, memory: str, shm: str, **options: Any) -> list[RayCommandHandler]:
    """Two hosts' agents' Ray command handlers (host-0, host-1) on the docker runtime at `engine_url`: each its
    own work directory under `work_dir`, containers capped at `memory` with `shm` of /dev/shm, 240 s for a
    node to register; `options` go to both (e.g. ``model_dir``)."""
    return [
        RayCommandHandler(
            containers=DockerRayContainers(base_url=engine_url),
            work_dir=work_dir / f"host-{index}",
            hostname=f"host-{index}",
            container_memory=memory,
            container_shm_size=shm,
            register_timeout_s=240,
            **options,
        )
        for index in (0, 1)
    ]


def head_payload(cluster_id: str, member_id: str, version: str, image: str) -> dict[str, Any]:
    """A ``ray.head.start`` payload on the docker runtime: fresh GCS and dashboard ports, one CPU (a dict:
    ``{**head_payload(...), "image": other}`` changes a field)."""
    return {
        "cluster_id": cluster_id,
        "member_id": member_id,
        "ray_version": version,
        "image": image,
        "runtime": "docker",
        "gcs_port": free_port(),
        "dashboard_port": free_port(),
        "num_cpus": 1,
    }


def worker_payload(head: dict[str, Any], member_id: str, head_address: str) -> dict[str, Any]:
    """The ``ray.worker.start`` payload of `member_id` joining the head started with `head` at `head_address`."""
    worker = {key: value for key, value in head.items() if key not in ("gcs_port", "dashboard_port")}
    return {**worker, "member_id": member_id, "head_address": head_address}


def remove_members(member_ids: list[str]) -> None:
    """Force-remove the Ray containers of these control-plane Ray nodes (whatever state they are in)."""
    for member_id in member_ids:
        podman("rm", "-f", "-t", "1", member_name(member_id), check=False)


def ray_container_env() -> dict[str, str]:
    """An agent's environment for Ray containers on Podman's Docker API; skips without Podman or the image."""
    url = engine_with(f"docker.io/rayproject/ray:{VERSION}", ".ci/ray-image")
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

"""The container of one Ray node in the docker runtime, as JSON-able ``docker run`` parameters."""

from __future__ import annotations

from typing import Any, Literal

from agent.ray.gcs import NODE_LABEL
from agent.ray.start_args import RAY_ENV, Role, ray_start_args
from agent.ray.versions import AGENT_PORTS, labels_need_json

DEFAULT_PORTS = {"gcs": 6379, "dashboard": 8265, "client_server": 10001, "dashboard_agent_listen": 52365}


def docker_run_spec(
    role: Role,
    version: str,
    gpu: bool,
    head_address: str | None,
    ports: dict[str, int] | None = None,
    *,
    name: str | None = None,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    resources: dict[str, float] | None = None,
    python_tag: str | None = None,
    network: Literal["host", "bridge"] = "host",
    shm_size: str = "2g",
    mem_limit: str | None = None,
    dashboard_host: str = "0.0.0.0",
    cluster_labels: dict[str, str] | None = None,
    node_ip_address: str | None = None,
) -> dict[str, Any]:
    """The container for one Ray node in the docker runtime, as JSON-able ``docker run`` parameters.

    Image ``rayproject/ray:<version>[-<python_tag>][-gpu]``. ``network="host"`` (the default, needed for
    multi-node clusters: Ray advertises its node IP and uses many ports) passes the chosen host ports to
    ``ray start`` (with the `AGENT_PORTS` and the ``min_worker``/``max_worker`` range when given);
    ``"bridge"`` keeps Ray's in-container defaults and publishes GCS (6379) and dashboard (8265) on the host
    ports asked for — enough for a single-node cluster. `shm_size` holds Ray's object store (/dev/shm;
    Docker's and Podman's default of 64 MB is far too small); `mem_limit` caps the container (Ray sizes its
    object store from it). `node_ip_address` is the address the node advertises to the other nodes
    (``--node-ip-address``); None lets Ray pick the address of the interface its default route uses.
    """
    if role not in ("head", "worker"):
        raise ValueError("role must be head or worker")
    if role == "worker" and not head_address:
        raise ValueError("a worker needs the head's address")
    if network not in ("host", "bridge"):
        raise ValueError("network must be host or bridge")
    wanted = {**DEFAULT_PORTS, **(ports or {})}
    inside = wanted if network == "host" else DEFAULT_PORTS
    tag = version + (f"-{python_tag}" if python_tag else "") + ("-gpu" if gpu else "")
    node_name = name or f"ray-{role}"
    command = [
        "ray",
        *ray_start_args(
            role=role,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            resources=resources,
            labels={NODE_LABEL: node_name},
            gcs_port=inside["gcs"] if role == "head" else None,
            head_address=head_address if role == "worker" else None,
            dashboard_port=inside["dashboard"] if role == "head" else None,
            dashboard_host=dashboard_host,
            client_server_port=inside["client_server"] if role == "head" else None,
            dashboard_agent_listen_port=inside["dashboard_agent_listen"],
            node_ip_address=node_ip_address,
            labels_as_json=labels_need_json(version),
            **{f"{key}_port": wanted.get(key) for key in AGENT_PORTS if network == "host"},
            worker_ports=(wanted["min_worker"], wanted["max_worker"])
            if network == "host" and wanted.get("min_worker") and wanted.get("max_worker")
            else None,
        ),
    ]
    spec: dict[str, Any] = {
        "image": f"rayproject/ray:{tag}",
        "name": node_name,
        "command": command,
        "detach": True,
        "shm_size": shm_size,
        "labels": {"cleverthis.ray.role": role, **(cluster_labels or {})},
        "environment": dict(RAY_ENV),
        # Ray drains on SIGTERM (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S); give it time before SIGKILL.
        "stop_signal": "SIGTERM",
        "stop_timeout": 60,
    }
    if mem_limit:
        spec["mem_limit"] = mem_limit
    if network == "host":
        spec["network_mode"] = "host"
    else:
        spec["ports"] = {"6379/tcp": wanted["gcs"], "8265/tcp": wanted["dashboard"]} if role == "head" else {}
    if gpu:
        spec["device_requests"] = [{"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}]
    return spec

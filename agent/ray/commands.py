"""The agent side of managed Ray: runs the `ray.*` commands (no Django).

`RayCommandHandler.run(command_type, payload, progress)` hands Ray job/Serve commands to `RayJobsHandler`
and node commands to the backend of the payload's ``runtime`` (`agent.ray.backends`):

- ``process``: Ray head/worker as host processes (tests and single machines without Docker);
- ``docker`` (production): a ``rayproject/ray`` container per Ray node; status and drain run inside the
  head container, with the cluster's own Ray;
- ``kuberay`` (kubernetes and argocd compute clusters): the whole Ray cluster is one KubeRay ``RayCluster``.

Every Ray node is named ``ray-<member_id>`` (the control plane's RayNode id): container name and Ray node
label, so status reports map back to control-plane rows. Commands are idempotent per member: starting a
running member answers its existing facts; stopping an unknown one succeeds with ``stopped=False``.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
from pathlib import Path
from typing import Any

from agent import protocol
from agent.errors import CommandFailed
from agent.executors.base import ProgressFn
from agent.ray.backends import DockerBackend, KubeRayBackend, ProcessBackend, RayBackend
from agent.ray.containers import DockerRayContainers, RayContainers
from agent.ray.jobs import RayJobsHandler
from agent.ray.kuberay import KubeRayGitOps, KubeRayKube
from agent.ray.members import member_name, member_of, normalize_status
from agent.ray.ports import port_in_use, ray_port_refusal
from agent.ray.process_runtime import RayProcessRuntime, RayRuntimeError

log = logging.getLogger(__name__)


class RayCommandHandler:
    """Executes `ray.*` commands; the agent's CommandRunner asks `handles()` then calls `run()`."""

    def __init__(
        self,
        *,
        process_runtime: RayProcessRuntime | None = None,
        containers: RayContainers | None = None,
        state_path: Path | None = None,
        hostname: str | None = None,
        default_num_cpus: float | None = None,
        register_timeout_s: float = 90.0,
        jobs: RayJobsHandler | None = None,
        kuberay: KubeRayKube | KubeRayGitOps | None = None,
        work_dir: Path | None = None,
        container_memory: str | None = None,
        container_shm_size: str = "2g",
        node_ip_address: str | None = None,
        model_dir: Path | None = None,
    ) -> None:
        work_dir = work_dir or (process_runtime.work_dir if process_runtime else None)
        self.jobs = jobs or RayJobsHandler(work_dir=work_dir / "jobs" if work_dir else None)
        self.process_runtime = process_runtime
        self.containers = containers
        self.kuberay = kuberay  # agent.ray.kuberay.KubeRayKube | KubeRayGitOps on kubernetes/argocd clusters
        self.hostname = hostname or socket.gethostname()
        self.process = ProcessBackend(
            process_runtime,
            state_path=state_path or (work_dir / "ray-members.json" if work_dir else None),
            hostname=self.hostname,
            default_num_cpus=default_num_cpus,
            register_timeout_s=register_timeout_s,
        )
        self.docker = DockerBackend(
            containers,
            state_path=work_dir / "ray-containers.json" if work_dir else None,
            hostname=self.hostname,
            register_timeout_s=register_timeout_s,
            container_memory=container_memory,
            container_shm_size=container_shm_size,
            node_ip_address=node_ip_address,
            model_dir=model_dir,
        )
        self.backends: dict[str, RayBackend] = {
            backend.runtime: backend for backend in (self.process, self.docker, KubeRayBackend(kuberay))
        }

    def dashboard_ports(self) -> set[int]:
        """Ports of the Ray dashboards this node runs and the Serve HTTP ports of deployments made here."""
        ports = set(self.jobs.serve_ports())
        for backend in self.backends.values():
            ports |= backend.dashboard_ports()
        return ports

    def proxy_targets(self) -> set[tuple[str, int]]:
        """(host, port) of the KubeRay heads' Services this node manages (dashboard and Serve)."""
        targets: set[tuple[str, int]] = set()
        for backend in self.backends.values():
            targets |= backend.proxy_targets()
        return targets

    def stop_all(self) -> None:
        """Stop every Ray node this agent started, workers before heads (the node was deleted)."""
        for backend in (self.process, self.docker):
            members = backend.members.load()
            for member_id in sorted(members, key=lambda m: members[m].get("role") == "head"):
                stop = protocol.RayNodeStopPayload(cluster_id="", member_id=member_id, runtime=backend.runtime)
                try:
                    backend.node_stop(stop, lambda *_, **__: None)
                except (CommandFailed, RayRuntimeError, OSError) as exc:
                    log.warning("could not stop Ray node %s: %s", member_name(member_id), exc)

    def handles(self, command_type: str) -> bool:
        """True for the `ray.*` command types (workload ones go to `self.jobs`)."""
        return command_type in protocol.RAY_NODE_COMMAND_TYPES or self.jobs.handles(command_type)

    def run(self, command_type: str, payload: Any, progress: ProgressFn) -> Any:
        """Run one `ray.*` command; returns its result type (`agent.protocol.results`) or raises `CommandFailed`."""
        if not self.handles(command_type):
            raise CommandFailed("unknown_command", f"{command_type} is not a Ray command")
        if self.jobs.handles(command_type):
            return self.jobs.run(command_type, payload, progress)
        if isinstance(payload, dict):
            try:
                payload = protocol.parse_payload(command_type, payload)
            except protocol.ProtocolError as exc:
                raise CommandFailed("invalid_payload", str(exc)) from None
        backend = self.backends.get(payload.runtime)
        if backend is None:
            raise CommandFailed("invalid_payload", f"unknown Ray runtime {payload.runtime!r}")
        try:
            return backend.execute(command_type, payload, progress)
        except ValueError as exc:
            raise CommandFailed("invalid_payload", str(exc)) from None
        except RayRuntimeError as exc:
            refusal = ray_port_refusal(str(exc))
            if refusal:  # Ray refused ports of its own node: a port conflict, with Ray's reason
                raise CommandFailed("conflict", refusal) from None
            raise CommandFailed("internal", str(exc)) from None


def default_handler(
    work_dir: Path, *, ray_bin: Path | None = None, executor: Any = None, model_dir: Path | None = None
) -> RayCommandHandler:
    """The handler an agent wires in: the process runtime when Ray is installed next to the agent, the
    docker runtime on the engine at DOCKER_HOST (connected on first use: an engine that is down then
    fails those commands with `docker_unavailable`), and KubeRay through `executor` on kubernetes and
    argocd clusters.

    Ray containers get ``CLEVERTHIS_RAY_MEMORY`` as their memory limit (e.g. ``8g``; none by default) and
    ``CLEVERTHIS_RAY_SHM_SIZE`` of /dev/shm for the object store (default ``2g``). ``CLEVERTHIS_RAY_NODE_IP``
    is the address this node's Ray nodes (containers and processes) advertise to the others; unset, Ray
    uses the address of the interface its default route goes through, which is wrong on a machine whose
    cluster network is not the one its default route takes. `model_dir` (the agent's model cache) is mounted
    read-only in the Ray containers, for endpoint ranks started inside them.
    """
    from agent.ray.kuberay import backend_for

    found = ray_bin or (Path(shutil.which("ray")) if shutil.which("ray") else None)
    node_ip = os.environ.get("CLEVERTHIS_RAY_NODE_IP", "").strip() or None
    runtime = RayProcessRuntime(found, work_dir / "ray", node_ip_address=node_ip) if found else None
    kuberay = backend_for(executor) if executor is not None else None
    return RayCommandHandler(
        process_runtime=runtime,
        containers=DockerRayContainers(),
        work_dir=work_dir / "ray",
        container_memory=os.environ.get("CLEVERTHIS_RAY_MEMORY") or None,
        container_shm_size=os.environ.get("CLEVERTHIS_RAY_SHM_SIZE") or "2g",
        kuberay=kuberay,
        node_ip_address=node_ip,
        model_dir=model_dir,
    )


__all__ = [
    "DockerRayContainers",
    "RayCommandHandler",
    "RayContainers",
    "default_handler",
    "member_name",
    "member_of",
    "normalize_status",
    "port_in_use",
]

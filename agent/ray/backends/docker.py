"""The ``docker`` runtime's backend (production): a ``rayproject/ray`` container per Ray node.

Containers come from `agent.ray.docker_spec.docker_run_spec` and run through a `RayContainers` engine
(`DockerRayContainers` uses the docker SDK). Status and drain run *inside* the head container
(`agent.ray.incontainer.program`), so they always speak the cluster's own Ray version. The containers this
agent runs are remembered in a JSON file, so the tunnel may reach their dashboards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from agent import protocol
from agent.errors import CommandFailed
from agent.executors.base import ProgressFn
from agent.ray import incontainer
from agent.ray.backends.base import MemberFile, RayBackend
from agent.ray.containers import RayContainers, available_memory_bytes, memory_bytes, short_reason
from agent.ray.docker_spec import docker_run_spec
from agent.ray.members import CONTAINER_RAY_DIR, LOG_FILES, log_text, member_name, normalize_status
from agent.ray.ports import free_port, port_in_use, ray_port_refusal, worker_port_window
from agent.ray.versions import AGENT_PORTS, agent_ports_need_pinning

T = TypeVar("T")
log = logging.getLogger(__name__)


class DockerBackend(RayBackend):
    """Ray nodes as containers on this node's engine; every command needs the engine."""

    runtime = "docker"

    def __init__(
        self,
        containers: RayContainers | None,
        *,
        state_path: Path | None,
        hostname: str,
        register_timeout_s: float = 90.0,
        container_memory: str | None = None,
        container_shm_size: str = "2g",
        node_ip_address: str | None = None,
        model_dir: Path | None = None,
    ) -> None:
        self.containers = containers
        # Containers this agent runs (member id → role, dashboard URL): the proxy may reach their dashboards.
        self.members = MemberFile(state_path)
        self.hostname = hostname
        self.register_timeout_s = register_timeout_s
        self.container_memory = container_memory or None
        self.container_shm_size = container_shm_size
        # The address this node's Ray containers advertise to the other nodes (None: Ray's default-route pick).
        self.node_ip_address = node_ip_address or None
        # This node's model cache, mounted read-only at the same path in every Ray container, so an endpoint
        # rank started inside one (`agent.workloads.container_rank`) finds its weights where the agent does.
        self.model_dir = Path(model_dir).resolve() if model_dir else None

    def dashboard_ports(self) -> set[int]:
        return self.members.dashboard_ports()

    def spec(
        self, p: protocol.RayHeadStartPayload | protocol.RayWorkerStartPayload, *, gcs_port: int | None = None
    ) -> dict[str, Any]:
        """The container for a head or worker start: the payload's image, host network.

        On the host network every port a Ray node binds is a port of the machine: the head takes the GCS and
        dashboard ports the control plane chose (a GCS port of 0: `gcs_port`, else a free one); the per-node
        ports Ray would otherwise fix (client server 10001, dashboard agent 52365), and the agent ports of Ray
        releases that draw them racily (`agent_ports_need_pinning`), are picked free here, outside the ephemeral
        range, and the node's workers get their own port window (`worker_port_window`) holding none of the
        node's own ports, so several Ray nodes can share a machine.
        The dashboard listens on loopback only: the control plane reaches it through this agent's tunnel.
        The agent's model cache (`model_dir`) is mounted read-only at its own path.
        """
        is_head = isinstance(p, protocol.RayHeadStartPayload)
        ports = {"dashboard_agent_listen": free_port()}
        if agent_ports_need_pinning(p.ray_version):
            ports.update({key: free_port() for key in AGENT_PORTS})
        if is_head:
            gcs = gcs_port or p.gcs_port or free_port()
            ports.update(gcs=gcs, dashboard=p.dashboard_port, client_server=free_port())
        window = worker_port_window(avoid=ports.values())  # never one of this node's own ports (Ray refuses)
        if window:
            ports.update(min_worker=window[0], max_worker=window[1])
        spec = docker_run_spec(
            "head" if is_head else "worker",
            p.ray_version,
            p.num_gpus > 0 or p.image.endswith("-gpu"),
            None if is_head else p.head_address,
            ports,
            name=member_name(p.member_id),
            num_cpus=p.num_cpus or None,
            num_gpus=p.num_gpus or None,
            shm_size=self.container_shm_size,
            mem_limit=self.container_memory,
            dashboard_host="127.0.0.1",
            cluster_labels={"cleverthis.ray.cluster": p.cluster_id, "cleverthis.ray.member": p.member_id},
            node_ip_address=self.node_ip_address,
        )
        spec["image"] = p.image
        if self.model_dir:
            spec["volumes"] = {str(self.model_dir): {"bind": str(self.model_dir), "mode": "ro"}}
        return spec

    # ---- commands ------------------------------------------------------------------------------

    def head_start(self, p: protocol.RayHeadStartPayload, progress: ProgressFn) -> protocol.RayNodeStartResult:
        name = member_name(p.member_id)
        state = self._engine().state(name)
        running = bool(state is not None and state.get("Running"))
        if not running:
            for port in (p.gcs_port, p.dashboard_port):
                if port and port_in_use(port):
                    raise CommandFailed("conflict", f"port {port} is already in use on {self.hostname}")
        # No GCS port asked for (0): a free one here, or the one the running head already listens on.
        remembered = (self.members.get(p.member_id) or {}).get("gcs_port") if running else None
        gcs_port = p.gcs_port or remembered or free_port()
        spec = self.spec(p, gcs_port=gcs_port)
        progress(f"starting Ray head container {spec['name']} ({spec['image']}) on GCS port {gcs_port}")
        container_id, joined = self._start_container(
            spec, "head", lambda: self._wait_joined(spec["name"], p.member_id, gcs_port)
        )
        dashboard_url = f"http://127.0.0.1:{p.dashboard_port}"
        self.members.put(p.member_id, {"role": "head", "dashboard_url": dashboard_url, "gcs_port": gcs_port})
        return protocol.RayNodeStartResult(
            container_id=container_id,
            ray_node_id=joined.ray_node_id,
            ip=joined.ip,
            hostname=self.hostname,
            gcs_port=gcs_port,
            gcs_address=f"{joined.ip}:{gcs_port}",
            dashboard_url=dashboard_url,
        )

    def worker_start(self, p: protocol.RayWorkerStartPayload, progress: ProgressFn) -> protocol.RayNodeStartResult:
        spec = self.spec(p)
        progress(f"starting Ray worker container {spec['name']} ({spec['image']}) joining {p.head_address}")
        container_id, _ = self._start_container(spec, "worker", lambda: self._wait_started(spec["name"]))
        self.members.put(p.member_id, {"role": "worker", "dashboard_url": ""})
        # The worker's node id is learnt from the head's status (the next ray.status matches it by label).
        return protocol.RayNodeStartResult(container_id=container_id, hostname=self.hostname)

    def node_stop(self, p: protocol.RayNodeStopPayload, progress: ProgressFn) -> protocol.RayNodeStopResult:
        name = member_name(p.member_id)
        state = self._engine().state(name)
        if state is not None and not state.get("Running", True):
            # What removing it erases: why it ended (raymgr removes a failed Ray node's container at once).
            why = self._exit_text(name, state)
            log.warning("removing Ray container %s, which had ended: %s", name, why)
            progress(f"Ray container {name} had ended: {why}")
        progress(f"stopping Ray container {name}")
        stopped = self._engine().stop(name, timeout_s=p.timeout_s)
        self.members.put(p.member_id, None)
        return protocol.RayNodeStopResult(stopped=stopped)

    def node_drain(self, p: protocol.RayNodeDrainPayload, progress: ProgressFn) -> protocol.RayNodeDrainResult:
        head_name = member_name(p.head_member_id)
        progress(f"draining Ray node {p.ray_node_id[:12]} through {head_name}")
        answer = self._in_container(
            head_name, ["drain", str(p.gcs_port), p.ray_node_id, p.reason, str(p.deadline_s)], "ray drain"
        )
        if not answer.get("accepted"):
            raise CommandFailed("conflict", f"Ray refused the drain: {answer.get('message', '')}")
        return protocol.RayNodeDrainResult(accepted=True)

    def status(self, p: protocol.RayStatusPayload, progress: ProgressFn) -> protocol.RayStatusResult:
        head_name = member_name(p.member_id)
        result = normalize_status(self._in_container(head_name, ["status", str(p.gcs_port)], "ray status"))
        if not p.include_logs:
            return result
        logs: dict[str, str] = {}
        for key, filename in LOG_FILES.items():
            path = f"{CONTAINER_RAY_DIR}/session_latest/logs/{filename}"
            _, output = self._engine().exec(head_name, ["tail", "-n", str(p.log_lines), path], timeout_s=15)
            logs[key] = log_text(output)
        return dataclasses.replace(result, logs=logs)

    # ---- helpers -------------------------------------------------------------------------------

    def _engine(self) -> RayContainers:
        if self.containers is None:
            raise CommandFailed("docker_unavailable", "this agent has no container engine for Ray")
        return self.containers

    def _in_container(self, name: str, args: list[str], what: str, timeout_s: float = 60.0) -> dict[str, Any]:
        argv = ["python", "-c", incontainer.program(), *args]
        code, output = self._engine().exec(name, argv, timeout_s=timeout_s)
        return incontainer.result_of(code, output, what)

    def _check_memory(self, role: str) -> None:
        wanted = memory_bytes(self.container_memory)
        free = available_memory_bytes()
        if wanted and free and wanted > free:
            raise CommandFailed(
                "insufficient_memory",
                f"the Ray {role} container needs {wanted >> 20} MB; {self.hostname} has {free >> 20} MB available",
            )

    def _check_running(self, name: str, role: str) -> None:
        """Fail with the reason when container `name` is no longer running (out of memory above all)."""
        state = self._engine().state(name)
        if state is None:
            raise CommandFailed("internal", f"the Ray {role} container {name} disappeared")
        if state.get("Running", True) and state.get("Status", "running") not in ("exited", "dead"):
            return
        if state.get("OOMKilled") or state.get("ExitCode") == 137:
            limit = f" (limit {self.container_memory})" if self.container_memory else ""
            raise CommandFailed("insufficient_memory", f"the Ray {role} container ran out of memory{limit}")
        output = self._engine().logs(name, lines=30)
        refusal = ray_port_refusal(output)
        if refusal:
            raise CommandFailed("conflict", refusal)
        last = [line for line in output.splitlines() if line.strip()]
        raise CommandFailed(
            "internal",
            f"the Ray {role} container exited with code {state.get('ExitCode')}: "
            f"{short_reason(last[-1]) if last else 'no output'}",
        )

    def _exit_text(self, name: str, state: dict[str, Any]) -> str:
        """How container `name` ended: its exit code, out of memory or not, and its last lines of output."""
        lines = [line.strip() for line in self._engine().logs(name, lines=12).splitlines() if line.strip()]
        oom = ", out of memory" if state.get("OOMKilled") else ""
        return log_text(f"exit code {state.get('ExitCode')}{oom}; last output: " + (" | ".join(lines) or "none"))[:2000]

    def _start_container(self, spec: dict[str, Any], role: str, wait: Callable[[], T]) -> tuple[str, T]:
        """Run `spec`, then `wait()` until the Ray node is up; on failure nothing is left behind."""
        self._check_memory(role)
        if self.model_dir:
            self.model_dir.mkdir(parents=True, exist_ok=True)  # the engine refuses to mount a missing folder
        container_id = self._engine().run(spec)
        try:
            return container_id, wait()
        except BaseException:
            with contextlib.suppress(CommandFailed):
                self._engine().stop(spec["name"], timeout_s=5)
            raise

    def _wait_joined(self, head_name: str, member_id: str, gcs_port: int) -> protocol.RayStatusNode:
        deadline = time.monotonic() + self.register_timeout_s
        last = ""
        while time.monotonic() < deadline:
            self._check_running(head_name, "head")
            try:
                status = normalize_status(self._in_container(head_name, ["status", str(gcs_port)], "ray status"))
            except CommandFailed as exc:
                last = exc.message
            else:
                found = next((n for n in status.nodes if n.member_id == member_id), None)
                if found is not None:
                    return found
            time.sleep(1.0)
        raise CommandFailed(
            "internal", f"Ray node {member_name(member_id)} did not join in time: {short_reason(last[-500:])}"
        )

    def _wait_started(self, name: str) -> None:
        """Until ``ray start`` in container `name` says the node runs (it has registered with the GCS)."""
        deadline = time.monotonic() + self.register_timeout_s
        while time.monotonic() < deadline:
            self._check_running(name, "worker")
            if "Ray runtime started" in self._engine().logs(name, lines=200):
                return
            time.sleep(1.0)
        raise CommandFailed("internal", f"the Ray worker {name} did not start within {self.register_timeout_s:.0f} s")

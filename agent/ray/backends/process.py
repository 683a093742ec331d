"""The ``process`` runtime's backend: Ray heads and workers as host processes (`RayProcessRuntime`).

For tests and single machines without Docker. It runs only the Ray installed next to the agent; members
are remembered in a JSON state file, so a restarted agent can still stop them.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import asdict
from pathlib import Path

from agent import protocol
from agent.errors import CommandFailed
from agent.executors.base import ProgressFn
from agent.ray.backends.base import MemberFile, RayBackend
from agent.ray.members import LOG_FILES, member_name, normalize_status, read_text, tail_lines
from agent.ray.ports import free_port, port_in_use
from agent.ray.process_runtime import RayNodeProcess, RayProcessRuntime


class ProcessBackend(RayBackend):
    """Ray nodes as ``ray start --block`` processes on this host; every command needs the runtime."""

    runtime = "process"

    def __init__(
        self,
        process_runtime: RayProcessRuntime | None,
        *,
        state_path: Path | None,
        hostname: str,
        default_num_cpus: float | None = None,
        register_timeout_s: float = 90.0,
    ) -> None:
        self.process_runtime = process_runtime
        self.members = MemberFile(state_path)
        self.hostname = hostname
        self.default_num_cpus = default_num_cpus
        self.register_timeout_s = register_timeout_s
        self._version: str | None = None

    def dashboard_ports(self) -> set[int]:
        return self.members.dashboard_ports()

    def member(self, member_id: str) -> RayNodeProcess | None:
        """The node remembered for `member_id` (running or not), None when unknown."""
        data = self.members.get(member_id)
        return RayNodeProcess(**data) if data else None

    # ---- commands ------------------------------------------------------------------------------

    def head_start(self, p: protocol.RayHeadStartPayload, progress: ProgressFn) -> protocol.RayNodeStartResult:
        self._check_version(p.ray_version)
        existing = self._running(p.member_id)
        if existing is not None:
            return self._facts(existing, already_running=True)
        for port in (p.gcs_port, p.dashboard_port):
            if port and port_in_use(port):
                raise CommandFailed("conflict", f"port {port} is already in use on {self.hostname}")
        gcs_port = p.gcs_port or free_port()  # none asked for (0): a free one on this machine
        progress(f"starting Ray {p.ray_version} head (process) on port {gcs_port}")
        node = self._runtime().start_head(
            gcs_port=gcs_port,
            dashboard_port=p.dashboard_port,
            num_cpus=self._num_cpus(p.num_cpus),
            num_gpus=p.num_gpus or None,
            name=member_name(p.member_id),
            timeout=self.register_timeout_s,
        )
        self.members.put(p.member_id, asdict(node))
        return self._facts(node)

    def worker_start(self, p: protocol.RayWorkerStartPayload, progress: ProgressFn) -> protocol.RayNodeStartResult:
        self._check_version(p.ray_version)
        existing = self._running(p.member_id)
        if existing is not None:
            return self._facts(existing, already_running=True)
        progress(f"starting Ray {p.ray_version} worker (process) joining {p.head_address}")
        node = self._runtime().start_worker(
            head_address=p.head_address,
            num_cpus=self._num_cpus(p.num_cpus),
            num_gpus=p.num_gpus or None,
            dashboard_agent_listen_port=free_port(),
            name=member_name(p.member_id),
            timeout=self.register_timeout_s,
        )
        self.members.put(p.member_id, asdict(node))
        return self._facts(node)

    def node_stop(self, p: protocol.RayNodeStopPayload, progress: ProgressFn) -> protocol.RayNodeStopResult:
        node = self.member(p.member_id)
        if node is None:
            return protocol.RayNodeStopResult(stopped=False, reason="no such Ray node on this machine")
        progress(f"stopping Ray {node.role} {node.name}")
        self._runtime().stop(node, grace_s=float(p.timeout_s))
        self.members.put(p.member_id, None)
        return protocol.RayNodeStopResult(stopped=True)

    def node_drain(self, p: protocol.RayNodeDrainPayload, progress: ProgressFn) -> protocol.RayNodeDrainResult:
        head = self.member(p.head_member_id) if p.head_member_id else None
        address = head.gcs_address if head is not None else f"127.0.0.1:{p.gcs_port}"
        progress(f"draining Ray node {p.ray_node_id[:12]} through {address}")
        accepted, message = self._runtime().drain_worker(
            p.ray_node_id, address=address, reason="idle", message=p.reason, deadline_s=p.deadline_s or None
        )
        if not accepted:
            raise CommandFailed("conflict", f"Ray refused the drain: {message}")
        return protocol.RayNodeDrainResult(accepted=True)

    def status(self, p: protocol.RayStatusPayload, progress: ProgressFn) -> protocol.RayStatusResult:
        head = self.member(p.member_id)
        if head is None or not self._runtime().alive(head):
            raise CommandFailed("not_found", f"the Ray head {member_name(p.member_id)} is not running here")
        try:
            status = self._runtime().cluster_status(head.gcs_address)
        except Exception as exc:
            raise CommandFailed("internal", f"cannot read the cluster status: {exc}") from None
        result = normalize_status(status.as_dict())
        if not p.include_logs:
            return result
        logs_dir = Path(head.temp_dir) / "session_latest" / "logs"
        logs = {key: tail_lines(read_text(logs_dir / filename), p.log_lines) for key, filename in LOG_FILES.items()}
        return dataclasses.replace(result, logs=logs)

    # ---- helpers -------------------------------------------------------------------------------

    def _runtime(self) -> RayProcessRuntime:
        if self.process_runtime is None:
            raise CommandFailed("unsupported", "this agent has no Ray process runtime (Ray not installed?)")
        return self.process_runtime

    def _facts(self, node: RayNodeProcess, *, already_running: bool | None = None) -> protocol.RayNodeStartResult:
        head = node.role == "head"
        return protocol.RayNodeStartResult(
            ray_node_id=node.node_id or "",
            ip=node.gcs_address.rsplit(":", 1)[0] if head else "",
            hostname=self.hostname,
            pid=node.pid,
            gcs_address=node.gcs_address,
            dashboard_url=node.dashboard_url or "",
            gcs_port=(node.ports.get("gcs") or None) if head else None,
            already_running=already_running,
        )

    def _running(self, member_id: str) -> RayNodeProcess | None:
        node = self.member(member_id)
        if node is not None and self._runtime().alive(node):
            return node
        return None

    def _num_cpus(self, requested: float) -> float:
        return requested or self.default_num_cpus or float(os.cpu_count() or 1)

    def _check_version(self, wanted: str) -> None:
        """The process runtime runs only the Ray installed next to the agent."""
        if self._version is None:
            self._version = self._runtime().installed_version()
        if wanted != self._version:
            raise CommandFailed(
                "unsupported",
                f"this agent's process runtime runs Ray {self._version}; Ray {wanted} needs the docker runtime",
            )

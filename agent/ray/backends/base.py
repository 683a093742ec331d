"""The interface every Ray runtime implements (one backend class per runtime), and a members state file.

The command handler picks a backend by the payload's ``runtime`` and calls `RayBackend.execute`, which
runs one of the five ``ray.*`` node commands and returns its result type (`agent.protocol.results`). Backends
are synchronous; a documented failure raises `agent.errors.CommandFailed`.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from agent import protocol
from agent.errors import CommandFailed
from agent.executors.base import ProgressFn


class _StopInFlight:
    """One stop of a member being carried out: those who join it wait for its outcome."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: protocol.RayNodeStopResult | None = None
        self.error: BaseException | None = None


class RayBackend(ABC):
    """Runs Ray nodes for one runtime (``process``, ``docker`` or ``kuberay``)."""

    runtime: ClassVar[str]
    _stops_lock = threading.Lock()

    @abstractmethod
    def head_start(self, p: protocol.RayHeadStartPayload, progress: ProgressFn) -> protocol.RayNodeStartResult:
        """Start (or answer the running) head of member `p.member_id`: its node id, address, dashboard."""

    @abstractmethod
    def worker_start(self, p: protocol.RayWorkerStartPayload, progress: ProgressFn) -> protocol.RayNodeStartResult:
        """Start (or answer the running) worker of member `p.member_id`, joining `p.head_address`."""

    @abstractmethod
    def node_drain(self, p: protocol.RayNodeDrainPayload, progress: ProgressFn) -> protocol.RayNodeDrainResult:
        """Ask the cluster to drain Ray node `p.ray_node_id`: accepted, or `CommandFailed`."""

    @abstractmethod
    def node_stop(self, p: protocol.RayNodeStopPayload, progress: ProgressFn) -> protocol.RayNodeStopResult:
        """Stop member `p.member_id`; ``stopped=False`` when it is not running here."""

    @abstractmethod
    def status(self, p: protocol.RayStatusPayload, progress: ProgressFn) -> protocol.RayStatusResult:
        """The cluster as `agent.ray.members.normalize_status` shapes it (plus log tails when asked)."""

    def stop_once(self, p: protocol.RayNodeStopPayload, progress: ProgressFn) -> protocol.RayNodeStopResult:
        """`node_stop`, except that a stop of a member already stopping joins that stop: it waits for it and
        answers its outcome (with ``joined: True``) rather than stopping the member again (a second
        ``docker stop`` of a stopping container kills it instead of letting Ray shut down)."""
        key = (p.member_id, p.delete)
        with self._stops_lock:
            stops: dict[tuple[str, bool], _StopInFlight] = vars(self).setdefault("_stops_in_flight", {})
            current: _StopInFlight | None = stops.get(key)
            leader = current is None
            if leader:
                current = stops[key] = _StopInFlight()
        assert current is not None
        if not leader:
            progress(f"a stop of Ray node {p.member_id} is already under way: waiting for it")
            current.done.wait()
            if current.error is not None:
                raise current.error
            return dataclasses.replace(current.result or protocol.RayNodeStopResult(), joined=True)
        try:
            current.result = self.node_stop(p, progress)
            return current.result
        except BaseException as exc:
            current.error = exc
            raise
        finally:
            with self._stops_lock:
                stops.pop(key, None)
            current.done.set()

    def dashboard_ports(self) -> set[int]:
        """Ports of the Ray dashboards this backend runs on this node (the control plane may proxy them)."""
        return set()

    def proxy_targets(self) -> set[tuple[str, int]]:
        """(host, port) off this node that the proxy may reach for this backend's clusters."""
        return set()

    def execute(self, command_type: str, payload: Any, progress: ProgressFn) -> Any:
        """Run one ``ray.*`` node command (payload already parsed); its result type."""
        match command_type:
            case "ray.head.start":
                return self.head_start(payload, progress)
            case "ray.worker.start":
                return self.worker_start(payload, progress)
            case "ray.node.drain":
                return self.node_drain(payload, progress)
            case "ray.node.stop":
                return self.stop_once(payload, progress)
            case "ray.status":
                return self.status(payload, progress)
        raise CommandFailed("unknown_command", f"{command_type} is not a Ray node command")


class MemberFile:
    """A JSON object of member id → facts, rewritten atomically; with no path it remembers nothing."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()

    def load(self) -> dict[str, dict[str, Any]]:
        """Every remembered member."""
        with self._lock:
            return self._read()

    def get(self, member_id: str) -> dict[str, Any] | None:
        """The facts of `member_id`, None when unknown."""
        return self.load().get(member_id)

    def put(self, member_id: str, data: dict[str, Any] | None) -> None:
        """Remember `data` for `member_id`, or forget it (None)."""
        if self.path is None:
            return
        with self._lock:
            members = self._read()
            if data is None:
                members.pop(member_id, None)
            else:
                members[member_id] = data
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(members))
            tmp.replace(self.path)

    def dashboard_ports(self) -> set[int]:
        """The ports in the remembered members' ``dashboard_url``."""
        ports = set()
        for data in self.load().values():
            tail = (data.get("dashboard_url") or "").rstrip("/").rsplit(":", 1)[-1]
            if tail.isdigit():
                ports.add(int(tail))
        return ports

    def _read(self) -> dict[str, dict[str, Any]]:
        if self.path is None or not self.path.exists():
            return {}
        return json.loads(self.path.read_text() or "{}")

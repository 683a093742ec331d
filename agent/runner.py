"""Runs one command frame end to end: parse the payload, route it, journal the outcome.

`CommandRunner.run` turns a `Command` into a `Result` or an `Error`: ``container.*`` goes to the
cluster's executor, ``model.download`` to the `ModelCache`, ``endpoint.*`` to the `EndpointManager`.
Every outcome (result or error) is appended to the command journal (`agent.journal`) before `run` returns, so
a command re-delivered with a finished idempotency key is answered from the journal without running
the work again, also after an agent restart. A key re-delivered while its first delivery still runs
waits for that run and gets the same outcome.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from agent.errors import CommandFailed
from agent.executors.base import Executor, ProgressFn
from agent.journal import CommandJournal
from agent.protocol import (
    RESULT_TYPES,
    Command,
    ContainerInfo,
    Error,
    GpuInfo,
    Inventory,
    InventoryProblem,
    ProtocolError,
    Result,
    parse_payload,
    result_to_dict,
)
from agent.ray.commands import RayCommandHandler
from agent.workloads.endpoints import EndpointManager
from agent.workloads.models import ModelCache

log = logging.getLogger(__name__)
# How many finished keys the inventory reports (the journal itself keeps all of them).
INVENTORY_KEYS = 1000
PROBLEM_CHARS = 1000  # the most of a failure's message an inventory problem carries
T = TypeVar("T")


class CommandRunner:
    """Executes commands for one node and remembers which idempotency keys are finished."""

    def __init__(
        self,
        *,
        executor: Executor,
        models: ModelCache,
        endpoints: EndpointManager,
        journal_path: Path,
        ray: RayCommandHandler | None = None,
    ) -> None:
        self.executor = executor
        self.ray = ray
        self.models = models
        self.endpoints = endpoints
        models.in_use = endpoints.models_in_use  # never evicted while a server runs from them
        self.journal_path = Path(journal_path)
        self.journal = CommandJournal(self.journal_path)
        self._lock = threading.Lock()
        self._done: dict[str, Result | Error] = self.journal.load()
        self._running: dict[str, threading.Event] = {}
        self._last_containers: list[ContainerInfo] = []
        self._failing_parts: set[str] = set()

    # ---- journal

    def record(self, key: str, command_type: str, outcome: Result | Error) -> None:
        """Journal the outcome of a command finished outside `run` (an agent update, by the new version)."""
        self.journal.append(key, command_type, outcome)
        with self._lock:
            self._done[key] = outcome

    def completed(self, idempotency_key: str) -> Result | Error | None:
        """The journaled outcome of a finished key, or None if it never finished here."""
        with self._lock:
            return self._done.get(idempotency_key)

    # ---- running

    def run(self, command: Command, progress: ProgressFn) -> Result | Error:
        """Execute `command` once per idempotency key; never raises."""
        key = command.idempotency_key
        while True:
            with self._lock:
                done = self._done.get(key)
                if done is not None:
                    return dataclasses.replace(done, command_id=command.command_id)
                waiting = self._running.get(key)
                if waiting is None:
                    self._running[key] = threading.Event()
                    break
            waiting.wait()
        try:
            outcome = self._execute(command, progress)
            self.journal.append(key, command.command_type, outcome)
            with self._lock:
                self._done[key] = outcome
            return outcome
        finally:
            with self._lock:
                self._running.pop(key).set()

    def _execute(self, command: Command, progress: ProgressFn) -> Result | Error:
        command_id = command.command_id
        try:
            payload = parse_payload(command.command_type, command.payload)
        except ProtocolError as exc:
            code = "unknown_command" if "unknown command type" in str(exc) else "invalid_payload"
            return Error(command_id=command_id, code=code, message=str(exc))
        try:
            data = result_data(command.command_type, self._route(command, payload, progress))
        except CommandFailed as exc:
            return Error(command_id=command_id, code=exc.code, message=exc.message, data=_jsonable(exc.data))
        except Exception as exc:
            log.exception("command %s (%s) failed unexpectedly", command_id, command.command_type)
            return Error(command_id=command_id, code="internal", message=f"{type(exc).__name__}: {exc}")
        return Result(command_id=command_id, data=data)

    def _route(self, command: Command, payload: Any, progress: ProgressFn) -> Any:
        """The handler's outcome: its command type's result type (`agent.protocol.results`)."""
        kind = command.command_type
        if kind.startswith("container."):
            return self.executor.execute(kind, payload, command_key=command.idempotency_key, progress=progress)
        if kind == "model.download":
            return self.models.download(payload, progress)
        if kind == "model.evict":
            return self.models.evict(payload)
        if kind.startswith("endpoint."):
            return self.endpoints.execute(kind, payload, progress=progress)
        if kind.startswith("ray."):
            if self.ray is None:
                raise CommandFailed("unsupported", "this agent has no Ray support (install the agent's ray extra)")
            return self.ray.run(kind, payload, progress)
        raise CommandFailed("unknown_command", f"no handler for {kind!r}")

    def end_workloads(self) -> None:
        """Stop every inference endpoint server and Ray node this agent started (the node was deleted).

        Containers are left to their engine: they are the machine owner's to keep or remove.
        """
        self.endpoints.stop_all()
        if self.ray is not None:
            self.ray.stop_all()
        log.info("node deleted: stopped this agent's endpoint servers and Ray nodes")

    # ---- inventory

    def proxy_ports(self) -> set[int]:
        """Local ports the control plane may open streams to: running endpoints and Ray dashboards."""
        ports = {e.port for e in self.endpoints.inventory(strays=False) if e.port}
        if self.ray is not None:
            ports |= self.ray.dashboard_ports()
        return ports

    def proxy_targets(self) -> set[tuple[str, int]]:
        """In-cluster (host, port) pairs streams may reach: the KubeRay heads' Services."""
        return self.ray.proxy_targets() if self.ray is not None else set()

    def inventory(self, gpus: list[GpuInfo]) -> Inventory:
        """Everything the node runs and holds, for `hello` and inventory reports; never raises.

        Each part is read on its own, so the engine changing underneath (a restart, containers going
        away) costs only its own part: containers that cannot be listed are reported as last listed
        (not as gone), any other part that fails as empty. The first failure of a part is logged with
        its traceback, repeats quietly until it reads again. Each part that failed is one of the inventory's
        `problems` (e.g. a kubernetes executor without credentials), which the node's page shows with the fix.
        """
        problems: list[InventoryProblem] = []
        containers = self._part("containers", self.executor.list_containers, self._last_containers, problems)
        self._last_containers = containers
        with self._lock:
            keys = list(self._done)[-INVENTORY_KEYS:]
        return Inventory(
            containers=containers,
            endpoints=self._part("endpoints", self.endpoints.inventory, [], problems),
            models=self._part("models", self.models.inventory, [], problems),
            gpus=list(gpus),
            completed_command_keys=keys,
            problems=problems,
            disk_free_bytes=self.models.disk_free_bytes(),
            cache_budget_bytes=self.models.budget_bytes,
        )

    def _part(
        self, name: str, read: Callable[[], list[T]], fallback: list[T], problems: list[InventoryProblem]
    ) -> list[T]:
        """`read()`, or `fallback` when it fails; a failure is added to `problems` (the control plane shows it)."""
        try:
            value = read()
        except Exception as exc:
            code, message = (exc.code, exc.message) if isinstance(exc, CommandFailed) else ("internal", repr(exc))
            problems.append(InventoryProblem(part=name, code=code, message=message[:PROBLEM_CHARS]))
            if name not in self._failing_parts:
                self._failing_parts.add(name)
                if isinstance(exc, CommandFailed):
                    log.warning("cannot read the %s for the inventory: %s", name, exc.message)
                else:
                    log.warning("cannot read the %s for the inventory", name, exc_info=exc)
            else:
                log.debug("still cannot read the %s for the inventory: %s", name, exc)
            return list(fallback)
        if name in self._failing_parts:
            self._failing_parts.discard(name)
            log.info("the %s read again for the inventory", name)
        return value


def result_data(command_type: str, result: Any) -> dict[str, Any]:
    """The `Result` data of a handler's outcome, which must be its command type's result type
    (`agent.protocol.RESULT_TYPES`): anything else (a dict above all) is a handler's bug, a `TypeError`
    that fails the command as ``internal``."""
    expected = RESULT_TYPES.get(command_type)
    if expected is None or not isinstance(result, expected):
        wanted = expected.__name__ if expected is not None else "no result type"
        raise TypeError(f"the {command_type} handler returned {type(result).__name__}, not its {wanted}")
    data: dict[str, Any] = _jsonable(result_to_dict(result))
    return data


def _jsonable(data: dict[str, Any]) -> dict[str, Any]:
    """`data` made safe for a JSON frame (paths and other objects become strings)."""
    result: dict[str, Any] = json.loads(json.dumps(data, default=str))
    return result


def build_executor(
    mode: str,
    mode_settings: dict[str, Any],
    *,
    docker_url: str | None = None,
    kubeconfig: str | None = None,
    workdir: Path | str | None = None,
) -> Executor:
    """The executor for the cluster's orchestration mode (from the control plane's `Welcome`)."""
    if mode == "standalone":
        from agent.executors.docker import DockerExecutor

        return DockerExecutor(base_url=docker_url or mode_settings.get("docker_url") or None)
    if mode == "kubernetes":
        from agent.executors.kubernetes import KubernetesExecutor

        return KubernetesExecutor(
            kubeconfig_path=kubeconfig or mode_settings.get("kubeconfig") or None,
            namespace=mode_settings.get("namespace") or None,
        )
    if mode == "argocd":
        from agent.executors.argocd import ArgoCDExecutor

        missing = [k for k in ("repo_url", "server", "app_name") if not mode_settings.get(k)]
        if missing:
            raise ValueError(f"argocd mode needs settings: {', '.join(missing)}")
        if workdir is None:
            raise ValueError("argocd mode needs a workdir for its clone")
        return ArgoCDExecutor(
            repo_url=mode_settings["repo_url"],
            branch=mode_settings.get("branch") or "main",
            server=mode_settings["server"],
            token=mode_settings.get("token") or "",
            app_name=mode_settings["app_name"],
            workdir=Path(workdir),
        )
    raise ValueError(f"unknown orchestration mode {mode!r} (expected standalone, kubernetes or argocd)")

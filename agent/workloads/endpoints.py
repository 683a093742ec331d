"""Inference endpoints: OpenAI-compatible servers (vLLM by default) started from cached models.

Each endpoint is a child process in its own session, listening on 127.0.0.1:<port> (the control plane
reaches it through the tunnel's proxied streams). Its record (pid, port, model, log file) is kept in
``<state_dir>/endpoints.json`` (`agent.workloads.endpoint_records`) so that an agent restart still knows,
reports and can stop the servers it started; stopping one ends its whole process tree (vLLM runs its engine
in child processes). The server is vLLM's GPU or CPU build as `agent.workloads.engine` chooses for the node;
``server_command`` (or ``CLEVERTHIS_ENDPOINT_SERVER``, split like a shell line) replaces its program part,
and the manager always appends ``--model <path> --port <port> --served-model-name <model_id> --host
127.0.0.1`` and the device's flags. A model that is not cached, or that cannot fit the node's free VRAM (GPU)
or available memory (CPU), fails at once with the reason instead of a server that never answers. A running
server is probed by `agent.workloads.endpoint_health` (`health_targets`, `mark_health`): one that stops
answering is reported `unresponsive`; a start of its id replaces it, a stop wakes it (SIGCONT) to take its
SIGTERM (`agent.workloads.readiness` waits for a new server to serve). Where a server runs is its
`agent.workloads.server_host.ServerHost`: a process of this node (`server_process.ProcessHost`), or, for a
rank of a multi-node group whose `EndpointGroup.container` names a Ray node's container, a rank inside that
container (`container_rank.ContainerHost`; its record names the container).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.errors import CommandFailed
from agent.executors.base import ProgressFn
from agent.protocol import (
    EndpointAdapterLoadPayload,
    EndpointAdapterResult,
    EndpointAdapterUnloadPayload,
    EndpointInfo,
    EndpointStartPayload,
    EndpointStartResult,
    EndpointStopPayload,
    EndpointStopResult,
    GpuInfo,
    ModelDownloadPayload,
    check_server_args,
)
from agent.protocol.cpu_engine import CPU_ENDPOINT_CORES
from agent.ray.containers import RayContainers
from agent.workloads.adapters import ENABLE_LORA, RUNTIME_UPDATES_ENV, EndpointAdapters, lora_enabled
from agent.workloads.container_rank import ContainerHost, ContainerRanks, rank_name
from agent.workloads.cpu_cores import allocate_cores, bind_env, node_cores
from agent.workloads.distributed import check_group, follower_argv, group_args, rank_env
from agent.workloads.endpoint_records import Records, forget_old_tombstones, load_records, save_records
from agent.workloads.engine import VLLM_MODULE, Engine, check_gpus, check_memory, choose_engine, weights_bytes
from agent.workloads.models import ModelCache
from agent.workloads.readiness import LOG_TAIL_BYTES, raise_if_cancelled, wait_follower, wait_ready
from agent.workloads.server_host import Launch, ServerHost
from agent.workloads.server_process import ProcessHost, free_port, log_tail, port_in_use
from agent.workloads.start_phases import PhaseClock
from agent.workloads.stray_servers import ServerProcess, mark_env, marked_servers

VLLM_COMMAND = [sys.executable, "-m", VLLM_MODULE]


def server_argv(engine: Engine, model_path: Path, port: int, payload: EndpointStartPayload) -> list[str]:
    """The server's command line: the engine's program, the flags the agent sets (`ENDPOINT_AGENT_ARGS`),
    the device's defaults, then the endpoint's own `extra_args` (a later flag wins in vLLM)."""
    group = payload.group
    flags = engine.args(pipelined=group.pipeline_parallel > 1)
    if group.distributed:
        flags += group_args(group)
    elif payload.gpus > 1:
        flags += ["--tensor-parallel-size", str(payload.gpus)]
    if group.role == "follower":  # headless: no port, no host (`agent.workloads.distributed`)
        return follower_argv(engine, model_path, payload.model_id, flags + list(payload.extra_args))
    argv = [
        *engine.program,
        "--model",
        str(model_path),
        "--port",
        str(port),
        "--served-model-name",
        payload.model_id,
        "--host",
        "127.0.0.1",
    ]
    argv += flags + list(payload.extra_args)
    if payload.adapters and not lora_enabled(argv):
        argv.append(ENABLE_LORA)  # a start naming adapters serves them
    return argv


# The inventory status of a server this agent started but does not own (`stray_servers`).
STRAY = "stray"
START_LOG_TAIL_BYTES = 2000


class EndpointManager:
    """Starts, stops and reports inference endpoint processes (thread-safe)."""

    def __init__(
        self,
        models: ModelCache,
        state_dir: Path | str,
        server_command: list[str] | None = None,
        gpus_fn: Callable[[], list[GpuInfo]] | None = None,
        *,
        ready_timeout_s: float = 600.0,
        stop_timeout_s: float = 15.0,
        cpu_cores: int = CPU_ENDPOINT_CORES,
        containers: RayContainers | None = None,
    ) -> None:
        self.models = models
        self.state_dir = Path(state_dir)
        self.server_command = list(server_command) if server_command else None
        self.gpus_fn = gpus_fn or (lambda: [])
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.cpu_cores = cpu_cores
        self._lock = threading.RLock()
        self.processes = ProcessHost()  # servers as processes of this node
        # endpoint id → the cancel flags of its starts in flight (set by a stop of that id)
        self._starting: dict[str, set[threading.Event]] = {}
        # ranks run inside Ray nodes' containers (`EndpointGroup.container`), on the docker runtime's engine
        self.ranks = ContainerRanks(containers)
        self.adapters = EndpointAdapters(models, self._lock, self._load, self._save, alive=self._alive)

    # ---- state file

    def _load(self) -> Records:
        return load_records(self.state_dir)

    def _save(self, state: Records) -> None:
        save_records(self.state_dir, state)

    # ---- commands

    def execute(
        self, command_type: str, payload: Any, *, progress: ProgressFn
    ) -> EndpointStartResult | EndpointStopResult | EndpointAdapterResult:
        """Run endpoint.start / endpoint.stop / endpoint.adapter.load / endpoint.adapter.unload."""
        if command_type == "endpoint.start":
            return self.start(payload, progress)
        if command_type == "endpoint.stop":
            return self.stop(payload)
        if command_type == "endpoint.adapter.load" and isinstance(payload, EndpointAdapterLoadPayload):
            return self.adapters.load(payload, progress)
        if command_type == "endpoint.adapter.unload" and isinstance(payload, EndpointAdapterUnloadPayload):
            return self.adapters.unload(payload)
        raise CommandFailed("unknown_command", f"the endpoint manager does not run {command_type!r}")

    def start(self, payload: EndpointStartPayload, progress: ProgressFn) -> EndpointStartResult:
        """Start serving a cached model (fetched first when missing and the payload says `download`), then load
        its adapters; returns endpoint_id, port, pid and how the start went (the running one if already up).

        The start is in flight from its first line: a stop of its id meanwhile cancels it (`conflict`, no
        server left running), even before its record exists."""
        cancel = threading.Event()
        with self._lock:
            self._starting.setdefault(payload.endpoint_id, set()).add(cancel)
        try:
            return self._start(payload, progress, cancel)
        finally:
            with self._lock:
                waiting = self._starting.get(payload.endpoint_id, set())
                waiting.discard(cancel)
                if not waiting:
                    self._starting.pop(payload.endpoint_id, None)

    def _start(
        self, payload: EndpointStartPayload, progress: ProgressFn, cancel: threading.Event
    ) -> EndpointStartResult:
        clock = PhaseClock()
        fetched = None
        if payload.download and self.models.path_for(payload.model_id, payload.revision) is None:
            # fetched outside the lock: the node's other endpoints are stopped and reported meanwhile
            download = ModelDownloadPayload(model_id=payload.model_id, revision=payload.revision)
            fetched = self.models.download(download, progress)
        with self._lock:
            raise_if_cancelled(payload, cancel)
            state = self._load()
            current = state.get(payload.endpoint_id)
            if current and current.get("status") == "unresponsive" and self._alive(current):
                self._end(current)  # a hung server is no answer to a start: replace it
                current = None
            if current and self._alive(current):
                if current["model_id"] != payload.model_id:
                    raise CommandFailed(
                        "conflict", f"endpoint {payload.endpoint_id} already serves {current['model_id']}"
                    )
                return EndpointStartResult(
                    endpoint_id=payload.endpoint_id,
                    port=current["port"],
                    pid=current["pid"],
                    device=current.get("device", "cpu"),
                    adapters=current.get("adapters", []) if current.get("lora") else None,
                )
            # The same allow-list as the control plane's (`agent.protocol.check_server_args`): vLLM runs on
            # this host, so a flag naming a file or code is refused here too, and a template naming a file.
            args, problems = check_server_args(list(payload.extra_args), exists=os.path.lexists)
            if problems:
                raise CommandFailed("invalid_payload", "server arguments refused: " + " ".join(problems))
            payload = dataclasses.replace(payload, extra_args=args)
            model_path = self.models.path_for(payload.model_id, payload.revision)
            if model_path is not None:
                downloaded = fetched is not None
                clock.weights_done(
                    "downloaded" if downloaded else "present",
                    fetched.size_bytes if downloaded else weights_bytes(model_path),
                )
            if model_path is None:
                raise CommandFailed(
                    "weights_missing",
                    f"model weights are not yet downloaded: {payload.model_id}@{payload.revision} is not in "
                    "this node's model cache (run model.download first)",
                    model_id=payload.model_id,
                )
            self.models.touch(payload.model_id, payload.revision)
            host = self._host(payload.group.container, rank_name(payload.endpoint_id))
            engine, model_path = host.prepare(self._engine(), model_path)
            check_group(payload.group, engine)
            follower = payload.group.role == "follower"
            chosen = check_gpus(payload, engine, model_path, self.gpus_fn)
            if engine.device == "cpu":
                check_memory(model_path)
            port = 0 if follower else payload.port or free_port()
            if payload.port and not follower and port_in_use(port):
                raise CommandFailed("conflict", f"port {port} is already in use on this node")
            argv = server_argv(engine, model_path, port, payload)
            env = rank_env(engine.env(dict(os.environ)), payload.group, engine)
            env = mark_env(env, endpoint_id=payload.endpoint_id, state_dir=self.state_dir)
            cores = self._cpu_cores(state, payload.endpoint_id) if engine.device == "cpu" else []
            if cores:
                env = bind_env(env, cores)
            lora = lora_enabled(argv) and not follower
            if lora:  # adapters come and go through the server's runtime API (`agent.workloads.adapters`)
                env[RUNTIME_UPDATES_ENV] = "True"
            if chosen:
                # The indices are NVML's, which count GPUs in PCI bus order; CUDA counts fastest first unless
                # told otherwise, so on a node with unlike GPUs the same index could name another card.
                env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g.index) for g in chosen)
            self.state_dir.mkdir(parents=True, exist_ok=True)
            log_path = self.state_dir / f"endpoint-{payload.endpoint_id}.log"
            progress(f"starting endpoint {payload.endpoint_id} for {payload.model_id} on port {port}")
            # a follower's command line names the leader's master port, not a port of its own
            token = payload.group.master_port if follower else port
            launch = Launch(argv, env, str(token), model_path, log_path, follower=follower, cores=cores)
            child = host.start(launch)
            clock.mark("server_started")
            clock.watch_log(log_path)
            state[payload.endpoint_id] = {
                "model_id": payload.model_id,
                "revision": payload.revision,
                "port": port,
                "pid": child.pid,
                "log": str(log_path),
                "gpus": [g.index for g in chosen],
                "cores": cores,
                "device": engine.device,
                "status": "starting",
                "started_at": time.time(),
                "lora": lora,
                "adapters": [],
                "role": payload.group.role,
                "group_leader": payload.group.distributed and not follower,
                # a follower has no port: its command line is recognised by the leader's port it names
                "argv_token": token,
                **host.fields(),
            }
            self._save(state)
        try:
            if follower:
                wait_follower(payload, child, log_path, progress)
            else:
                wait_ready(payload, child, port, log_path, progress, cancel, clock, self.ready_timeout_s)
            adapters = self.adapters.load_all(port, list(payload.adapters), progress) if lora else []
            if payload.adapters:
                clock.mark("adapters")
        except CommandFailed:
            with self._lock:
                host.stop(child.pid, timeout_s=self.stop_timeout_s)  # a failed start leaves no server behind
                state = self._load()
                record = state.get(payload.endpoint_id)
                if record is not None and record.get("pid") == child.pid and record.get("status") != "stopped":
                    state.pop(payload.endpoint_id)  # a stop's tombstone stays
                    self._save(state)
            raise_if_cancelled(payload, cancel)
            raise
        with self._lock:
            raise_if_cancelled(payload, cancel)  # stopped as it became ready: the stop ended the server
            state = self._load()
            record = state.get(payload.endpoint_id)
            if record is not None and record.get("pid") == child.pid and record.get("status") == "starting":
                record.update(status="running", adapters=adapters)
                self._save(state)
        note = "runs as a follower rank" if follower else f"answers on port {port}"
        progress(f"endpoint {payload.endpoint_id} {note}", percent=100.0)
        return EndpointStartResult(
            endpoint_id=payload.endpoint_id,
            port=port,
            pid=child.pid,
            device=engine.device,
            log_tail=log_tail(log_path, LOG_TAIL_BYTES)[
                -START_LOG_TAIL_BYTES:
            ],  # the server's start-up lines, for the UI
            phases=clock.result(),
            adapters=adapters if lora else None,
        )

    def stop(self, payload: EndpointStopPayload) -> EndpointStopResult:
        """Stop the endpoint's server (SIGTERM, then SIGKILL).

        Stopping an endpoint this node stopped before answers "stopped" again (re-delivery is safe: the
        record stays as a tombstone); an id this node never ran fails with `not_found`.
        """
        with self._lock:
            state = self._load()
            record = state.get(payload.endpoint_id)
            in_flight = self._starting.get(payload.endpoint_id, set())
            for cancel in in_flight:
                cancel.set()
            if record is None and in_flight:  # its start has not spawned the server yet: it never will
                state[payload.endpoint_id] = {"status": "stopped", "pid": 0, "stopped_at": time.time()}
                forget_old_tombstones(state)
                self._save(state)
                return EndpointStopResult(endpoint_id=payload.endpoint_id, status="stopped", pid=0)
            strays = [p.pid for p in self._strays(state) if p.endpoint_id == payload.endpoint_id]
            for pid in strays:
                self.processes.stop(pid, timeout_s=self.stop_timeout_s)
            if record is None and strays:
                return EndpointStopResult(endpoint_id=payload.endpoint_id, status="stopped", pid=strays[0])
            if record is None:
                raise CommandFailed(
                    "not_found",
                    f"no endpoint {payload.endpoint_id} has run on this node",
                    endpoint_id=payload.endpoint_id,
                )
            if record.get("status") == "stopped":
                return EndpointStopResult(endpoint_id=payload.endpoint_id, status="stopped", pid=record["pid"])
            if self._alive(record) or self.processes.owns(record["pid"]):
                self._end(record)
            record.update(status="stopped", stopped_at=time.time())
            forget_old_tombstones(state)
            self._save(state)
        return EndpointStopResult(endpoint_id=payload.endpoint_id, status="stopped", pid=record["pid"])

    def inventory(self, *, strays: bool = True) -> list[EndpointInfo]:
        """The endpoints whose server process is alive (status starting until it answered, then running;
        unresponsive while its health probes fail: `agent.workloads.endpoint_health`), then the servers this
        agent started but does not own (`stray`: no live record holds them; `agent.workloads.stray_servers`)."""
        with self._lock:
            state = self._load()
            found = self._strays(state) if strays else []
        owned = [
            EndpointInfo(
                endpoint_id=endpoint_id,
                model_id=rec["model_id"],
                port=rec["port"],
                status=rec.get("status", "running"),
                pid=rec["pid"],
            )
            for endpoint_id, rec in sorted(state.items())
            if rec.get("status") != "stopped" and self._alive(rec)
        ]
        return owned + [
            EndpointInfo(endpoint_id=p.endpoint_id, model_id=p.model_id, port=p.port, status=STRAY, pid=p.pid)
            for p in found
        ]

    def models_in_use(self) -> set[tuple[str, str]]:
        """(model id, revision) of each server alive now: the cache never evicts them."""
        with self._lock:
            state = self._load()
        return {
            (rec["model_id"], rec.get("revision", "main"))
            for rec in state.values()
            if rec.get("status") != "stopped" and self._alive(rec)
        }

    def health_targets(self) -> list[tuple[str, int]]:
        """(endpoint id, port) of each server to probe: alive, and running or unresponsive (not starting)."""
        with self._lock:
            state = self._load()
        return [
            (endpoint_id, rec["port"])
            for endpoint_id, rec in sorted(state.items())
            if rec.get("status", "running") in ("running", "unresponsive")
            and rec.get("role", "leader") == "leader"  # a follower serves no HTTP: the leader speaks for it
            and self._alive(rec)
        ]

    def generation_probes(self) -> dict[str, str]:
        """{endpoint id: model id} of the group leaders among `health_targets`: probed with a one-token
        completion, as their /health does not see a follower rank die (`agent.workloads.endpoint_health`)."""
        with self._lock:
            state = self._load()
        return {ep: rec["model_id"] for ep, rec in state.items() if rec.get("group_leader")}

    def mark_health(self, endpoint_id: str, healthy: bool) -> bool:
        """Record a probe verdict: running → unresponsive (not `healthy`) or back; True when the status changed.

        Only a running or unresponsive record changes (a server stopped or restarting meanwhile keeps its status).
        """
        with self._lock:
            state = self._load()
            record = state.get(endpoint_id)
            wanted = "running" if healthy else "unresponsive"
            if record is None or record.get("status", "running") not in ("running", "unresponsive"):
                return False
            if record.get("status", "running") == wanted:
                return False
            record["status"] = wanted
            self._save(state)
            return True

    def stop_all(self) -> None:
        """Stop every endpoint this manager knows, and the servers it started but lost (agent shutdown with
        workloads to be drained)."""
        for endpoint_id, record in list(self._load().items()):
            if record.get("status") != "stopped":
                self.stop(EndpointStopPayload(endpoint_id=endpoint_id))
        with self._lock:
            for stray in self._strays(self._load()):
                self.processes.stop(stray.pid, timeout_s=self.stop_timeout_s)

    # ---- helpers

    def _engine(self) -> Engine:
        engine = choose_engine(self.gpus_fn())
        return Engine(self.server_command, engine.device) if self.server_command else engine

    def _host(self, container: str | None, rank: str) -> ServerHost:
        """Where a server runs: in the Ray node's container `container` (as `rank`), else on this node."""
        return ContainerHost(self.ranks, container, rank) if container else self.processes

    def _host_of(self, record: dict[str, Any]) -> ServerHost:
        return self._host(record.get("container"), record.get("rank", ""))

    def _strays(self, state: Records) -> list[ServerProcess]:
        """Marked server processes (`stray_servers`) that are no live record's server."""
        owned = set()
        for rec in state.values():
            host = self._host_of(rec)
            if rec.get("status") != "stopped" and host.local and host.alive(rec):
                owned.add(rec["pid"])
        return [p for p in marked_servers(self.state_dir) if p.pid not in owned]

    def _alive(self, record: dict[str, Any]) -> bool:
        """Whether the record's server still runs (`ServerHost.alive`)."""
        return self._host_of(record).alive(record)

    def _end(self, record: dict[str, Any]) -> None:
        """End the record's server (`ServerHost.stop`)."""
        self._host_of(record).stop(record["pid"], timeout_s=self.stop_timeout_s)

    def _cpu_cores(self, state: Records, endpoint_id: str) -> list[int]:
        """Cores for a new CPU server: ones no other live server of this agent is bound to (`cpu_cores`)."""
        held = [
            rec.get("cores", [])
            for other, rec in state.items()
            if other != endpoint_id and rec.get("status") != "stopped" and self._alive(rec)
        ]
        return allocate_cores(held, cores=node_cores(), count=self.cpu_cores)

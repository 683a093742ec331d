"""Ray runtimes for the agent: the `process` runtime (Ray head/worker as host processes) and the docker spec.

The `process` runtime serves tests and single machines without Docker: each Ray node is one
``ray start --block`` process started in its own session, so everything Ray spawns for that node (GCS,
raylet, dashboard, workers — workers take their own process groups, but stay in the session) can be
stopped without touching any other Ray on the machine. A bare ``ray stop`` is never used: it kills every
Ray on the host.

Cluster state is read from the head's GCS with Ray's autoscaler v2 SDK
(``ray.autoscaler.v2.sdk.get_cluster_status``): pending task/actor/placement-group bundles and, per node,
status, total/used resources and idle time. Draining uses the GCS ``DrainNode`` RPC
(``ray._raylet.GcsClient.drain_node``, what ``ray drain-node`` calls). Ray is imported lazily, so the agent
imports this module on nodes without Ray. The production docker runtime gets its container from
`docker_run_spec`.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Role = Literal["head", "worker"]

# Label every node we start carries, so its Ray node id can be found from our own name for it.
NODE_LABEL = "cleverthis.io/ray-node"
HEAD_RESOURCE = "node:__internal_head__"
# Ray puts its sockets at <temp dir>/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store, and an
# AF_UNIX path holds at most 107 bytes: the temp dir may take what is left (the longest session name).
MAX_UNIX_PATH = 107
SOCKET_SUFFIX = len("/session_2026-12-03_13-45-54_123456_4194304/sockets/plasma_store")
DRAIN_REASONS = {"idle": "DRAIN_NODE_REASON_IDLE_TERMINATION", "preemption": "DRAIN_NODE_REASON_PREEMPTION"}


class RayRuntimeError(RuntimeError):
    """A Ray node failed to start, stop, or answer; the message carries the log tail when there is one."""


@dataclass(frozen=True)
class RayNodeProcess:
    """A Ray node this runtime started: its ``ray start --block`` session leader and where it keeps files."""

    name: str
    role: Role
    pid: int
    gcs_address: str
    temp_dir: str
    log_path: str
    ports: dict[str, int]
    dashboard_url: str | None = None
    node_id: str | None = None

    @property
    def address(self) -> str:
        """The GCS address drivers and other nodes connect to."""
        return self.gcs_address


# The head is a node like any other; the alias names what `start_head` returns.
HeadInfo = RayNodeProcess


@dataclass(frozen=True)
class RayNodeStatus:
    """One Ray node as the GCS reports it (fields line up with `raymgr.autoscaler.WorkerState`)."""

    node_id: str
    name: str | None  # our NODE_LABEL, when the node was started by us
    is_head: bool
    status: str  # RUNNING, IDLE, DRAINING
    idle_s: float
    resources: dict[str, float]
    available: dict[str, float]
    ip_address: str = ""
    activity: list[str] = field(default_factory=list)

    @property
    def draining(self) -> bool:
        """True once the GCS accepted a drain for this node."""
        return self.status == "DRAINING"


@dataclass(frozen=True)
class PendingDemand:
    """Pending resource bundles (one per task/actor/placement-group bundle), as `ClusterDemand.pending`."""

    bundles: list[dict[str, float]]
    # Placement groups waiting, with their strategy and bundles (already included in `bundles`).
    placement_groups: list[dict[str, Any]] = field(default_factory=list)
    # `ray.autoscaler.sdk.request_resources` constraints (not included in `bundles`).
    constraints: list[dict[str, float]] = field(default_factory=list)
    truncated: bool = False


@dataclass(frozen=True)
class RayClusterStatus:
    """A snapshot of a Ray cluster for the autoscaler: pending demand, head free capacity, live nodes."""

    demand: PendingDemand
    head_free: dict[str, float]
    nodes: list[RayNodeStatus]

    @property
    def workers(self) -> list[RayNodeStatus]:
        """Every live non-head node."""
        return [node for node in self.nodes if not node.is_head]

    def node_named(self, name: str) -> RayNodeStatus | None:
        """The live node carrying our label `name`, if any."""
        return next((node for node in self.nodes if node.name == name), None)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form for the wire."""
        return asdict(self)


RAY_WORKER_PORTS = (10002, 19999)  # Ray's default --min-worker-port/--max-worker-port
LISTEN_PORTS_FROM = 20000


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (and for binding port 0)."""
    try:
        low, high = (int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def free_port(host: str = "127.0.0.1", *, attempts: int = 200) -> int:
    """A TCP port nothing listens on right now, for a server that binds it later.

    Drawn outside the kernel's ephemeral range: a port there can become some outgoing connection's
    source port between this check and the server's bind (a Ray 2.9 raylet died when its runtime-env
    agent's port was taken that way), a port below it cannot. Also above Ray's worker ports (10002-19999).
    Falls back to a kernel-chosen port when none is found.
    """
    low, high = ephemeral_port_range()
    candidates = [
        (start, end)
        for start, end in ((LISTEN_PORTS_FROM, low - 1), (max(LISTEN_PORTS_FROM, high + 1), 65535))
        if start <= end
    ]
    sizes = [end - start + 1 for start, end in candidates]
    for _ in range(attempts if candidates else 0):
        start, _end = random.choices(candidates, weights=sizes)[0]
        port = start + random.randrange(sizes[candidates.index((start, _end))])
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


WORKER_PORT_WINDOW = 1000
WORKER_PORTS_FROM = 11000  # above the bottom of Ray's default range, which every other Ray node walks first


def worker_port_window(size: int = WORKER_PORT_WINDOW) -> tuple[int, int] | None:
    """A random range of `size` ports for one Ray node's workers, or None where there is no room for one.

    Every Ray node otherwise hands its workers ports from the same default range (10002-19999), walking it
    from the bottom after a bind check: two nodes on one host network starting workers together give the
    same port to both, and the later worker dies binding it (its actor "died unexpectedly"). A window
    starts at random within Ray's default range (where `free_port` never draws) above its bottom, so
    nodes rarely overlap, and when they do they walk different ports.
    """
    last_start = min(RAY_WORKER_PORTS[1] + 1, ephemeral_port_range()[0]) - size
    if last_start < WORKER_PORTS_FROM:
        return None
    start = random.randint(WORKER_PORTS_FROM, last_start)
    return start, start + size - 1


def session_pids(sid: int) -> list[int]:
    """Live (non-zombie) processes whose session id is `sid`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            if os.getsid(pid) != sid:
                continue
            with open(f"/proc/{pid}/stat", "rb") as stat:
                state = stat.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            pids.append(pid)
    return pids


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


# Ray's own settings for every node this agent starts. Serve gives a new HTTP proxy 5 s to answer its first
# ready check, then kills it; on a busy machine starting the proxy's worker and importing its web stack
# takes longer, and Ray 2.9's `serve.start` then fails ("The actor died unexpectedly"). Within the 60 s
# `serve.start` itself waits for the proxies.
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "45"}


def _fmt_resources(resources: dict[str, float]) -> str:
    return json.dumps(resources, sort_keys=True)


def ray_start_args(
    *,
    role: Role,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    resources: dict[str, float] | None = None,
    labels: dict[str, str] | None = None,
    gcs_port: int | None = None,
    head_address: str | None = None,
    dashboard_port: int | None = None,
    dashboard_host: str = "127.0.0.1",
    client_server_port: int | None = None,
    dashboard_agent_listen_port: int | None = None,
    node_ip_address: str | None = None,
    temp_dir: str | None = None,
    labels_as_json: bool = False,
    dashboard_agent_grpc_port: int | None = None,
    runtime_env_agent_port: int | None = None,
    metrics_export_port: int | None = None,
    worker_ports: tuple[int, int] | None = None,
) -> list[str]:
    """The ``ray start --block`` arguments (after ``ray``) for a head or a worker.

    `labels_as_json`: Ray before 2.45 reads ``--labels`` as a JSON object, later ones as ``k=v,k=v``.
    The agent ports (`dashboard_agent_grpc_port`, `runtime_env_agent_port`, `metrics_export_port`) are
    passed when given (see `agent_ports_need_pinning`); `worker_ports` is this node's ``(min, max)`` worker
    port range (see `worker_port_window`).
    """
    args = ["start", "--block", "--disable-usage-stats"]
    if role == "head":
        if not gcs_port:
            raise ValueError("a head needs an explicit gcs_port (Ray's default 6379 is Redis's)")
        args += ["--head", f"--port={gcs_port}", f"--dashboard-host={dashboard_host}"]
        if dashboard_port:
            args.append(f"--dashboard-port={dashboard_port}")
        if client_server_port:
            args.append(f"--ray-client-server-port={client_server_port}")
    else:
        if not head_address:
            raise ValueError("a worker needs the head's address")
        args.append(f"--address={head_address}")
    if num_cpus is not None:
        args.append(f"--num-cpus={num_cpus:g}")
    if num_gpus is not None:
        args.append(f"--num-gpus={num_gpus:g}")
    if resources:
        args.append(f"--resources={_fmt_resources(resources)}")
    if labels:
        if labels_as_json:
            args.append("--labels=" + json.dumps(dict(sorted(labels.items())), separators=(",", ":")))
        else:
            args.append("--labels=" + ",".join(f"{key}={value}" for key, value in sorted(labels.items())))
    if dashboard_agent_listen_port:
        args.append(f"--dashboard-agent-listen-port={dashboard_agent_listen_port}")
    if dashboard_agent_grpc_port:
        args.append(f"--dashboard-agent-grpc-port={dashboard_agent_grpc_port}")
    if runtime_env_agent_port:
        args.append(f"--runtime-env-agent-port={runtime_env_agent_port}")
    if metrics_export_port:
        args.append(f"--metrics-export-port={metrics_export_port}")
    if worker_ports:
        args += [f"--min-worker-port={worker_ports[0]}", f"--max-worker-port={worker_ports[1]}"]
    if node_ip_address:
        args.append(f"--node-ip-address={node_ip_address}")
    if temp_dir:
        args.append(f"--temp-dir={temp_dir}")
    return args


class RayProcessRuntime:
    """Runs Ray heads and workers as host processes and stops only the ones it started."""

    def __init__(
        self,
        ray_bin: Path,
        work_dir: Path,
        *,
        node_ip_address: str | None = None,
        shutdown_drain_s: float = 5.0,
    ) -> None:
        self.ray_bin = Path(ray_bin)
        self.work_dir = Path(work_dir)
        self.node_ip_address = node_ip_address
        self.shutdown_drain_s = shutdown_drain_s
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._nodes: dict[str, RayNodeProcess] = {}

    # --- starting -------------------------------------------------------------------------------

    def _temp_root(self, name: str) -> Path:
        """A fresh Ray temp dir short enough for Ray's socket paths: under work_dir when that fits, else
        ``/tmp/ray-<short id>-XXXXXXXX`` (the agent's default state dir, /etc/cleverthis-agent, does not fit).
        """
        prefix = f"ray-{name[-6:]}-"
        fits = len(str(self.work_dir)) + 1 + len(prefix) + 8 + SOCKET_SUFFIX <= MAX_UNIX_PATH
        base = self.work_dir if fits else Path(tempfile.gettempdir())
        base.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
        if len(str(root)) + SOCKET_SUFFIX > MAX_UNIX_PATH:
            root.rmdir()
            raise RayRuntimeError(f"no temp dir short enough for Ray's sockets (tried {root})")
        return root

    def installed_version(self) -> str:
        """The version of the Ray this runtime starts (the one installed next to `ray_bin`)."""
        venv = self.ray_bin.resolve().parent.parent
        for dist in sorted(venv.glob("lib/python*/site-packages/ray-*.dist-info")):
            return dist.name[len("ray-") : -len(".dist-info")]
        out = subprocess.run([str(self.ray_bin), "--version"], capture_output=True, text=True, timeout=60).stdout
        return out.strip().rsplit(" ", 1)[-1].rstrip(",") if out.strip() else ""

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        # Job entrypoints and Ray's own Python processes must find the venv that holds this Ray.
        env["PATH"] = f"{self.ray_bin.parent}{os.pathsep}{env.get('PATH', '')}"
        env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = str(self.shutdown_drain_s)
        env.update(RAY_ENV)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _spawn(self, *, name: str, args: list[str], temp_dir: Path) -> tuple[int, Path]:
        log_dir = self.work_dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                [str(self.ray_bin), *args],
                cwd=temp_dir,
                env=self._env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._children[popen.pid] = popen
        return popen.pid, log_path

    def _wait_started(self, pid: int, log_path: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "Ray runtime started." in log_path.read_text(errors="replace"):
                return
            popen = self._children.get(pid)
            if popen is not None and popen.poll() is not None:
                raise RayRuntimeError(f"ray start exited with {popen.returncode}: {_tail(log_path)}")
            time.sleep(0.2)
        raise RayRuntimeError(f"ray start did not come up within {timeout}s: {_tail(log_path)}")

    def _wait_registered(self, node: RayNodeProcess, timeout: float) -> RayNodeProcess:
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                found = self.cluster_status(node.gcs_address).node_named(node.name)
            except Exception as exc:  # GCS still starting
                last_error, found = exc, None
            if found is not None:
                return RayNodeProcess(**{**asdict(node), "node_id": found.node_id})
            if not self.alive(node):
                raise RayRuntimeError(f"Ray node {node.name} exited while joining: {_tail(Path(node.log_path))}")
            time.sleep(0.3)
        raise RayRuntimeError(f"Ray node {node.name} did not register within {timeout}s ({last_error})")

    def start_head(
        self,
        *,
        gcs_port: int,
        dashboard_port: int,
        num_cpus: float,
        num_gpus: float | None = None,
        resources: dict[str, float] | None = None,
        client_server_port: int | None = None,
        dashboard_agent_listen_port: int | None = None,
        name: str | None = None,
        timeout: float = 90.0,
    ) -> HeadInfo:
        """Start a Ray head on `gcs_port` (never Ray's default 6379) and wait until it has registered.

        The returned address is the one Ray advertises (``<node ip>:<gcs_port>``; Ray maps loopback to the
        node's IP), which drivers and workers on other machines can reach.
        """
        if gcs_port == 6379:
            raise ValueError("gcs_port 6379 is Redis's port; pass a free port")
        name = name or f"head-{uuid.uuid4().hex[:8]}"
        ports = {
            "gcs": gcs_port,
            "dashboard": dashboard_port,
            # Ray's defaults (10001, 52365) would collide with other Rays on the machine.
            "client_server": client_server_port or free_port(),
            "dashboard_agent_listen": dashboard_agent_listen_port or free_port(),
        }
        temp_dir = self._temp_root(name)
        args = ray_start_args(
            role="head",
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            resources=resources,
            labels={NODE_LABEL: name},
            gcs_port=gcs_port,
            dashboard_port=dashboard_port,
            client_server_port=ports["client_server"],
            dashboard_agent_listen_port=ports["dashboard_agent_listen"],
            node_ip_address=self.node_ip_address,
            temp_dir=str(temp_dir),
            worker_ports=worker_port_window(),
        )
        pid, log_path = self._spawn(name=name, args=args, temp_dir=temp_dir)
        node = RayNodeProcess(
            name=name,
            role="head",
            pid=pid,
            gcs_address=f"127.0.0.1:{gcs_port}",
            temp_dir=str(temp_dir),
            log_path=str(log_path),
            ports=ports,
            dashboard_url=f"http://127.0.0.1:{dashboard_port}",
        )
        self._nodes[name] = node
        try:
            self._wait_started(pid, log_path, timeout)
            # The address Ray advertises (its node IP, never loopback), written once the head is up.
            address_file = temp_dir / "ray_current_cluster"
            _wait_for(lambda: ":" in _read(address_file), timeout, f"{address_file} to be written")
            node = RayNodeProcess(**{**asdict(node), "gcs_address": _read(address_file).strip()})
            self._nodes[name] = node
            node = self._wait_registered(node, timeout)
        except BaseException:
            self.stop(node, grace_s=3.0)  # nothing ran on it yet: no drain to wait for
            raise
        self._nodes[name] = node
        return node

    def start_worker(
        self,
        *,
        head_address: str,
        num_cpus: float,
        dashboard_agent_listen_port: int,
        num_gpus: float | None = None,
        resources: dict[str, float] | None = None,
        name: str | None = None,
        timeout: float = 90.0,
    ) -> RayNodeProcess:
        """Start a Ray worker joining `head_address` and wait until the head lists it."""
        name = name or f"worker-{uuid.uuid4().hex[:8]}"
        temp_dir = self._temp_root(name)
        args = ray_start_args(
            role="worker",
            head_address=head_address,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            resources=resources,
            labels={NODE_LABEL: name},
            dashboard_agent_listen_port=dashboard_agent_listen_port,
            node_ip_address=self.node_ip_address,
            temp_dir=str(temp_dir),
            worker_ports=worker_port_window(),
        )
        pid, log_path = self._spawn(name=name, args=args, temp_dir=temp_dir)
        node = RayNodeProcess(
            name=name,
            role="worker",
            pid=pid,
            gcs_address=head_address,
            temp_dir=str(temp_dir),
            log_path=str(log_path),
            ports={"dashboard_agent_listen": dashboard_agent_listen_port},
        )
        self._nodes[name] = node
        try:
            self._wait_started(pid, log_path, timeout)
            node = self._wait_registered(node, timeout)
        except BaseException:
            self.stop(node, grace_s=3.0)  # nothing ran on it yet: no drain to wait for
            raise
        self._nodes[name] = node
        return node

    # --- stopping -------------------------------------------------------------------------------

    def _owns(self, node: RayNodeProcess) -> bool:
        """True when `node.pid`'s session is the one we started (its processes name our temp dir).

        Works after an agent restart too, and guards against a reused pid.
        """
        if node.pid in self._children:
            return True
        marker = node.temp_dir.encode()
        for pid in session_pids(node.pid):
            try:
                if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return True
            except OSError:
                continue
        return False

    def processes(self, node: RayNodeProcess) -> list[int]:
        """Live processes of `node` (its whole session)."""
        if not self._owns(node):
            return []
        return session_pids(node.pid)

    def alive(self, node: RayNodeProcess) -> bool:
        """True while the node's ``ray start`` process runs."""
        popen = self._children.get(node.pid)
        if popen is not None:
            return popen.poll() is None
        return node.pid in self.processes(node)

    def stop(self, node: RayNodeProcess, *, grace_s: float = 20.0, remove_files: bool = True) -> None:
        """Stop every process of `node`, and nothing else: SIGTERM its ``ray start`` (Ray then drains the
        node and stops its own children), then SIGTERM and finally SIGKILL whatever is left in its session.
        """
        owned = self._owns(node)
        popen = self._children.get(node.pid)
        if owned:
            _signal_all([node.pid], signal.SIGTERM)
            self._wait_gone(node.pid, grace_s, leader_only=True)
            for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                remaining = session_pids(node.pid)
                if not remaining:
                    break
                _signal_all(remaining, sig)
                self._wait_gone(node.pid, wait_s)
        if popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=5)
            self._children.pop(node.pid, None)
        if owned and session_pids(node.pid):
            raise RayRuntimeError(f"Ray node {node.name} left processes {session_pids(node.pid)}")
        self._nodes.pop(node.name, None)
        if remove_files:
            shutil.rmtree(node.temp_dir, ignore_errors=True)

    def _wait_gone(self, sid: int, timeout: float, *, leader_only: bool = False) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            popen = self._children.get(sid)
            if popen is not None:
                popen.poll()  # reap our child so it does not linger as a zombie
            live = session_pids(sid)
            if not live or (leader_only and sid not in live):
                return
            time.sleep(0.2)

    def stop_all(self) -> None:
        """Stop every node this runtime started (workers first)."""
        errors = []
        for node in sorted(self._nodes.values(), key=lambda n: n.role == "head"):
            try:
                self.stop(node)
            except RayRuntimeError as exc:
                errors.append(str(exc))
        if errors:
            raise RayRuntimeError("; ".join(errors))

    def nodes(self) -> list[RayNodeProcess]:
        """Nodes started by this runtime and not stopped yet."""
        return list(self._nodes.values())

    # --- reading and draining -------------------------------------------------------------------

    def cluster_status(self, address: str, *, timeout: int = 10, max_bundles: int = 1000) -> RayClusterStatus:
        """Pending demand, head free capacity and live nodes of the cluster whose GCS is at `address`."""
        return cluster_status(address, timeout=timeout, max_bundles=max_bundles)

    def drain_worker(
        self, node_id: str, *, address: str, reason: str = "idle", message: str = "", deadline_s: float | None = None
    ) -> tuple[bool, str]:
        """Ask the GCS to drain node `node_id`; returns (accepted, rejection message).

        ``reason="idle"`` is refused by Ray when the node is no longer idle (so a worker that picked up work
        since the decision is kept); ``"preemption"`` is always accepted and lets running work finish until
        `deadline_s`. An accepted idle drain makes the raylet exit by itself; `stop` then cleans up.
        """
        return drain_node(address, node_id, reason=reason, message=message, deadline_s=deadline_s)


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RayRuntimeError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def _bundles(demand: Any, limit: int) -> tuple[list[dict[str, float]], bool]:
    out: list[dict[str, float]] = []
    for by_count in demand.bundles_by_count:
        for _ in range(by_count.count):
            if len(out) >= limit:
                return out, True
            out.append({key: float(value) for key, value in by_count.bundle.items()})
    return out, False


def cluster_status(address: str, *, timeout: int = 10, max_bundles: int = 1000) -> RayClusterStatus:
    """Read a cluster's state from its GCS with ``ray.autoscaler.v2.sdk.get_cluster_status``.

    `max_bundles` caps the pending bundles listed (a queue of thousands says no more to an autoscaler
    bounded by max_workers than a thousand does); `PendingDemand.truncated` tells when it applied.
    """
    from ray.autoscaler.v2.sdk import get_cluster_status

    status = get_cluster_status(address, timeout=timeout)
    bundles: list[dict[str, float]] = []
    truncated = False
    for demand in status.resource_demands.ray_task_actor_demand:
        more, cut = _bundles(demand, max_bundles - len(bundles))
        bundles += more
        truncated |= cut
    groups = []
    for demand in status.resource_demands.placement_group_demand:
        more, cut = _bundles(demand, max_bundles - len(bundles))
        bundles += more
        truncated |= cut
        groups.append({"pg_id": demand.pg_id, "strategy": demand.strategy, "state": demand.state, "bundles": more})
    constraints = []
    for demand in status.resource_demands.cluster_constraint_demand:
        constraints += _bundles(demand, max_bundles)[0]

    nodes = []
    head_free: dict[str, float] = {}
    infos = [*status.active_nodes, *status.idle_nodes]
    # Ray before 2.10 has no labels in the autoscaler's NodeInfo: read them from the GCS node table.
    labels_of = {} if all(hasattr(i, "labels") for i in infos) else _gcs_labels(address)
    for info in infos:
        usage = info.resource_usage
        if usage is None:
            continue
        total = {u.resource_name: float(u.total) for u in usage.usage}
        available = {u.resource_name: float(u.total - u.used) for u in usage.usage}
        is_head = HEAD_RESOURCE in total
        node = RayNodeStatus(
            node_id=info.node_id or "",
            name=(getattr(info, "labels", None) or labels_of.get(info.node_id or "", {})).get(NODE_LABEL),
            is_head=is_head,
            status=info.node_status or "",
            idle_s=usage.idle_time_ms / 1000.0,
            resources=_schedulable(total),
            available=_schedulable(available),
            ip_address=info.ip_address,
            activity=list(getattr(info, "node_activity", None) or []),
        )
        nodes.append(node)
        if is_head and not node.draining:
            head_free = node.available
    demand = PendingDemand(bundles=bundles, placement_groups=groups, constraints=constraints, truncated=truncated)
    return RayClusterStatus(demand=demand, head_free=head_free, nodes=nodes)


def _gcs_labels(address: str) -> dict[str, dict[str, str]]:
    """Node id (hex) → labels, from the GCS node table (older Rays answer dicts of bytes)."""
    from ray._raylet import GcsClient

    def text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    found: dict[str, dict[str, str]] = {}
    for key, info in GcsClient(address=address).get_all_node_info().items():
        node_id = key.hex() if isinstance(key, bytes) else text(key)
        raw = info.get("labels", {}) if isinstance(info, dict) else getattr(info, "labels", {})
        found[node_id] = {text(k): text(v) for k, v in dict(raw or {}).items()}
    return found


def _schedulable(resources: dict[str, float]) -> dict[str, float]:
    """Drop Ray's implicit per-node resources (``node:<ip>``, ``node:__internal_head__``)."""
    return {key: value for key, value in resources.items() if not key.startswith("node:")}


def drain_node(
    address: str, node_id: str, *, reason: str = "idle", message: str = "", deadline_s: float | None = None
) -> tuple[bool, str]:
    """The GCS DrainNode RPC (``ray drain-node``): returns (accepted, rejection message)."""
    from ray._raylet import GcsClient
    from ray.core.generated import autoscaler_pb2

    if reason not in DRAIN_REASONS:
        raise ValueError(f"reason must be one of {sorted(DRAIN_REASONS)}")
    deadline_ms = 0 if deadline_s is None else int((time.time() + deadline_s) * 1000)
    args = [node_id, autoscaler_pb2.DrainNodeReason.Value(DRAIN_REASONS[reason]), message or f"cleverthis: {reason}"]
    client = GcsClient(address=address)
    try:
        answer = client.drain_node(*args, deadline_ms)
    except TypeError:  # Ray before 2.10: no deadline, and a bare "accepted"
        answer = client.drain_node(*args)
    accepted, rejection = answer if isinstance(answer, tuple) else (answer, "")
    return bool(accepted), str(rejection or "")


def labels_need_json(version: str) -> bool:
    """True for Ray releases whose ``ray start --labels`` takes a JSON object (before 2.45)."""
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) < (2, 45)


AGENT_PORTS = ("dashboard_agent_grpc", "runtime_env_agent", "metrics_export")


def agent_ports_need_pinning(version: str) -> bool:
    """True for Ray releases that pick their agents' ports themselves in a racy way (before 2.60).

    Ray 2.9 draws the dashboard agent's gRPC, the runtime-env agent's and the metrics export ports at
    random from the ephemeral range, checks them free and binds them seconds later: on a shared host
    network another process can take one meanwhile (the raylet then dies: "Runtime Env Agent timed out").
    Ray 2.60 binds port 0 and publishes what it got, so it is left to do so. Both take the flags.
    """
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return True
    return (major, minor) < (2, 60)


# --- production: the docker runtime's container spec ---------------------------------------------

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

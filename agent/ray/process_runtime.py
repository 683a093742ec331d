"""The `process` runtime: Ray heads and workers as host processes, each stopped without touching any other.

It serves tests and single machines without Docker: each Ray node is one ``ray start --block`` process
started in its own session, so everything Ray spawns for that node (GCS, raylet, dashboard, workers —
workers take their own process groups, but stay in the session) can be stopped without touching any
other Ray on the machine. A bare ``ray stop`` is never used: it kills every Ray on the host.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent.ray.gcs import NODE_LABEL, RayClusterStatus, cluster_status, drain_node
from agent.ray.ports import free_port, worker_port_window
from agent.ray.start_args import RAY_ENV, Role, ray_start_args

# Ray puts its sockets at <temp dir>/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store, and an
# AF_UNIX path holds at most 107 bytes: the temp dir may take what is left (the longest session name).
MAX_UNIX_PATH = 107
SOCKET_SUFFIX = len("/session_2026-12-03_13-45-54_123456_4194304/sockets/plasma_store")


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
            worker_ports=worker_port_window(avoid=ports.values()),  # Ray refuses a range holding its own ports
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
            worker_ports=worker_port_window(avoid={dashboard_agent_listen_port}),
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

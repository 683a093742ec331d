"""The agent side of managed Ray: runs the `ray.*` commands (no Django).

`RayCommandHandler.run(command_type, payload, progress)` executes one command with the payload's runtime:

- ``process``: Ray head/worker as host processes through `agent.ray.runtime.RayProcessRuntime` (tests and
  single machines without Docker);
- ``kuberay`` (kubernetes and argocd compute clusters): the whole Ray cluster is one KubeRay
  ``RayCluster`` applied by `agent.ray.kuberay` (head start = apply or resume, stop = suspend or, with
  ``delete``, delete; status = the resource's status plus the head's Ray API); KubeRay's autoscaler
  runs the workers, so worker starts and drains are refused;
- ``docker`` (production): a ``rayproject/ray`` container per Ray node, its spec from
  `agent.ray.runtime.docker_run_spec`, run through a `RayContainers` engine (`DockerRayContainers` uses the
  docker SDK). Status and drain run *inside* the head container (``python -c``, the code of
  `agent.ray.runtime` itself), so they always speak the cluster's own Ray version.

Every Ray node is named ``ray-<member_id>`` (the control plane's RayNode id): container name and Ray node
label, so status reports map back to control-plane rows. Commands are idempotent per member: starting a
running member answers its existing facts; stopping an unknown one succeeds with ``stopped: false``.
Process-runtime members are remembered in a JSON state file so a restarted agent can still stop them.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import socket
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from agent import protocol
from agent.errors import CommandFailed
from agent.executors.base import ProgressFn
from agent.ray import runtime
from agent.ray.jobs import RayJobsHandler
from agent.ray.runtime import RayNodeProcess, RayProcessRuntime, RayRuntimeError, docker_run_spec

RAY_COMMAND_TYPES = frozenset({"ray.head.start", "ray.worker.start", "ray.node.drain", "ray.node.stop", "ray.status"})
NAME_PREFIX = "ray-"
# Where Ray keeps logs: <temp dir>/session_latest/logs (process: our --temp-dir; docker: /tmp/ray).
CONTAINER_RAY_DIR = "/tmp/ray"
LOG_FILES = {"gcs": "gcs_server.out", "autoscaler": "monitor.log"}


def member_name(member_id: str) -> str:
    """Container name and Ray node label of a control-plane Ray node."""
    return f"{NAME_PREFIX}{member_id}"


def member_of(label: str | None) -> str:
    """The member id in a Ray node label we set ('' for nodes we did not start)."""
    return label[len(NAME_PREFIX) :] if label and label.startswith(NAME_PREFIX) else ""


def port_in_use(port: int, host: str = "0.0.0.0") -> bool:
    """True when something already listens on `port` (so a Ray head cannot bind it)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def normalize_status(status: dict[str, Any]) -> dict[str, Any]:
    """`RayClusterStatus.as_dict()` in the shape the control plane stores (`ray_cluster_record_status`)."""
    nodes = [
        {
            "ray_node_id": node.get("node_id", ""),
            "member_id": member_of(node.get("name")),
            "is_head": bool(node.get("is_head")),
            "alive": True,
            "status": node.get("status", ""),
            "idle_s": float(node.get("idle_s", 0.0)),
            "resources": node.get("resources", {}),
            "available": node.get("available", {}),
            "ip": node.get("ip_address", ""),
        }
        for node in status.get("nodes", [])
    ]
    demand = status.get("demand", {})
    return {
        "nodes": nodes,
        "pending": demand.get("bundles", []),
        "head_free": status.get("head_free", {}),
        "placement_groups": demand.get("placement_groups", []),
        "truncated": bool(demand.get("truncated", False)),
    }


def _tail_lines(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:]) if lines else ""


# --------------------------------------------------------------------------------------------------
# The container engine (docker runtime)


class RayContainers(Protocol):
    """What the docker runtime needs from a container engine."""

    def run(self, spec: dict[str, Any]) -> str:
        """Run `spec` (a `docker_run_spec`), pulling its image if missing; its id (a running one is kept)."""
        ...

    def stop(self, name: str, *, timeout_s: int) -> bool:
        """Stop and remove container `name`; False when there was none."""
        ...

    def exec(self, name: str, argv: list[str], *, timeout_s: float) -> tuple[int, str]:
        """Run `argv` in container `name`; (exit code, combined output)."""
        ...

    def state(self, name: str) -> dict[str, Any] | None:
        """The engine's ``State`` of container `name` (Running, ExitCode, OOMKilled…); None when absent."""
        ...

    def logs(self, name: str, *, lines: int) -> str:
        """The last `lines` lines of container `name`'s output ('' when absent)."""
        ...


def short_reason(exc: BaseException | str, limit: int = 300) -> str:
    """One line of an engine error for a user: the explanation, never a traceback."""
    text = str(getattr(exc, "explanation", None) or exc)
    if "Traceback (most recent call last)" in text:
        head, _, tail = text.partition("Traceback (most recent call last)")
        lines = [line for line in tail.splitlines() if line.strip()]
        text = f"{head.strip()} {lines[-1].strip() if lines else ''}"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


_PORT_MARKERS = ("address already in use", "port is already allocated", "bind: address")
_MEMORY_MARKERS = ("cannot allocate memory", "out of memory", "memory limit")


class DockerRayContainers:
    """`RayContainers` on the Docker engine (or Podman's Docker API) via the docker SDK.

    An engine that does not answer is `docker_unavailable`; an image that cannot be pulled is
    `image_pull_failed`; the engine refusing a port or memory is `conflict` / `insufficient_memory`.
    """

    def __init__(self, client: Any = None, *, base_url: str | None = None) -> None:
        self._client = client
        self.base_url = base_url

    @contextlib.contextmanager
    def _engine(self) -> Any:
        import docker
        import requests

        try:
            if self._client is None:
                client = docker.DockerClient(base_url=self.base_url) if self.base_url else docker.from_env()
                client.ping()
                self._client = client
            yield self._client
        except docker.errors.APIError as exc:
            if exc.status_code and exc.status_code >= 500 and "connection" in str(exc).lower():
                raise CommandFailed("docker_unavailable", f"the container engine failed: {short_reason(exc)}") from None
            raise
        except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
            self._client = None
            raise CommandFailed(
                "docker_unavailable", f"the container engine is not answering: {short_reason(exc)}"
            ) from None

    def _ensure_image(self, client: Any, image: str) -> None:
        import docker

        try:
            client.images.get(image)
            return
        except docker.errors.ImageNotFound:
            pass
        try:
            client.images.pull(image)
            client.images.get(image)
        except docker.errors.APIError as exc:
            raise CommandFailed(
                "image_pull_failed", f"pulling {image} failed: {short_reason(exc)}", image=image
            ) from None

    def run(self, spec: dict[str, Any]) -> str:
        import docker

        with self._engine() as client:
            try:
                existing = client.containers.get(spec["name"])
            except docker.errors.NotFound:
                existing = None
            if existing is not None:
                if existing.status == "running":
                    return existing.id
                existing.remove(force=True)  # a stopped leftover: start afresh
            self._ensure_image(client, spec["image"])
            kwargs = {k: v for k, v in spec.items() if k != "stop_timeout"}
            try:
                return client.containers.run(**kwargs).id
            except docker.errors.ImageNotFound as exc:
                raise CommandFailed("image_pull_failed", f"image {spec['image']}: {short_reason(exc)}") from None
            except docker.errors.APIError as exc:
                with contextlib.suppress(docker.errors.APIError):
                    client.containers.get(spec["name"]).remove(force=True)
                lowered = str(exc).lower()
                if any(marker in lowered for marker in _PORT_MARKERS):
                    raise CommandFailed("conflict", f"port already in use: {short_reason(exc)}") from None
                if any(marker in lowered for marker in _MEMORY_MARKERS):
                    raise CommandFailed("insufficient_memory", short_reason(exc)) from None
                raise CommandFailed("internal", f"the engine refused {spec['name']}: {short_reason(exc)}") from None

    def stop(self, name: str, *, timeout_s: int) -> bool:
        import docker

        with self._engine() as client:
            try:
                container = client.containers.get(name)
            except docker.errors.NotFound:
                return False
            with contextlib.suppress(docker.errors.APIError):
                container.stop(timeout=timeout_s)
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)
            return True

    def exec(self, name: str, argv: list[str], *, timeout_s: float) -> tuple[int, str]:
        import docker

        with self._engine() as client:
            try:
                container = client.containers.get(name)
                code, output = container.exec_run(argv, demux=False)
            except docker.errors.NotFound:
                raise CommandFailed("not_found", f"container {name} does not exist") from None
            except docker.errors.APIError as exc:  # e.g. the container stopped
                raise CommandFailed("not_found", f"container {name} is not running: {short_reason(exc)}") from None
            return int(code or 0), (output or b"").decode("utf-8", "replace")

    def state(self, name: str) -> dict[str, Any] | None:
        import docker

        with self._engine() as client:
            try:
                return dict(client.containers.get(name).attrs.get("State") or {})
            except docker.errors.NotFound:
                return None

    def logs(self, name: str, *, lines: int) -> str:
        import docker

        with self._engine() as client:
            try:
                return client.containers.get(name).logs(tail=lines).decode("utf-8", "replace")
            except docker.errors.NotFound:
                return ""


def memory_bytes(text: str | None) -> int:
    """'512m' / '2g' / '1073741824' → bytes (0 for none)."""
    if not text:
        return 0
    text = text.strip().lower().rstrip("b")
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def available_memory_bytes() -> int:
    """MemAvailable of this machine (0 when unknown)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


# Run inside the head container: agent.ray.runtime's own code (stdlib + Ray), then one action.
_IN_CONTAINER_MAIN = """
import json as _json, sys as _sys
def _address(port):
    import os as _os
    if _os.environ.get("RAY_ADDRESS"):
        return _os.environ["RAY_ADDRESS"]
    try:
        return open("/tmp/ray/ray_current_cluster").read().strip()
    except OSError:
        return "127.0.0.1:" + port
_action = _sys.argv[1]
if _action == "status":
    print("RAYJSON" + _json.dumps(cluster_status(_address(_sys.argv[2])).as_dict()))
elif _action == "drain":
    _ok, _msg = drain_node(_address(_sys.argv[2]), _sys.argv[3], reason="idle", message=_sys.argv[4],
                           deadline_s=float(_sys.argv[5]) or None)
    print("RAYJSON" + _json.dumps({"accepted": _ok, "message": _msg}))
"""


def in_container_script() -> str:
    """The ``python -c`` program for status/drain inside a Ray container."""
    return inspect.getsource(runtime) + _IN_CONTAINER_MAIN


def _script_json(code: int, output: str, what: str) -> dict[str, Any]:
    for line in reversed(output.splitlines()):
        if line.startswith("RAYJSON"):
            return json.loads(line[len("RAYJSON") :])
    raise CommandFailed("not_found" if code else "internal", f"{what} failed (exit {code}): {output[-1500:]}")


# --------------------------------------------------------------------------------------------------
# The handler


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
        kuberay: Any = None,
        work_dir: Path | None = None,
        container_memory: str | None = None,
        container_shm_size: str = "2g",
        node_ip_address: str | None = None,
    ) -> None:
        work_dir = work_dir or (process_runtime.work_dir if process_runtime else None)
        self.jobs = jobs or RayJobsHandler(work_dir=work_dir / "jobs" if work_dir else None)
        self.process_runtime = process_runtime
        self.containers = containers
        self.state_path = state_path or (work_dir / "ray-members.json" if work_dir else None)
        # Containers this agent runs (member id → role, dashboard URL): the proxy may reach their dashboards.
        self.containers_path = work_dir / "ray-containers.json" if work_dir else None
        self.hostname = hostname or socket.gethostname()
        self.default_num_cpus = default_num_cpus
        self.register_timeout_s = register_timeout_s
        self.kuberay = kuberay  # agent.ray.kuberay.KubeRayKube | KubeRayGitOps on kubernetes/argocd clusters
        self.container_memory = container_memory or None
        self.container_shm_size = container_shm_size
        # The address this node's Ray containers advertise to the other nodes (None: Ray's default-route pick).
        self.node_ip_address = node_ip_address or None
        self._lock = threading.Lock()
        self._process_version: str | None = None

    def dashboard_ports(self) -> set[int]:
        """Ports of the Ray dashboards this node runs (the control plane may proxy to them)."""
        with self._lock:
            members = {**self._load(), **self._load_containers()}
        ports = set(self.jobs.serve_ports())  # Serve HTTP ports of deployments made here
        for data in members.values():
            url = data.get("dashboard_url") or ""
            tail = url.rstrip("/").rsplit(":", 1)[-1]
            if tail.isdigit():
                ports.add(int(tail))
        return ports

    def proxy_targets(self) -> set[tuple[str, int]]:
        """(host, port) of the KubeRay heads' Services this node manages (dashboard and Serve)."""
        return self.kuberay.proxy_targets() if self.kuberay is not None else set()

    def handles(self, command_type: str) -> bool:
        """True for the `ray.*` command types (workload ones go to `self.jobs`)."""
        return command_type in RAY_COMMAND_TYPES or self.jobs.handles(command_type)

    def run(self, command_type: str, payload: Any, progress: ProgressFn) -> dict[str, Any]:
        """Run one `ray.*` command; returns the result data or raises `CommandFailed`."""
        if not self.handles(command_type):
            raise CommandFailed("unknown_command", f"{command_type} is not a Ray command")
        if self.jobs.handles(command_type):
            return self.jobs.run(command_type, payload, progress)
        if isinstance(payload, dict):
            try:
                payload = protocol.parse_payload(command_type, payload)
            except protocol.ProtocolError as exc:
                raise CommandFailed("invalid_payload", str(exc)) from None
        method = getattr(self, f"_{payload.runtime}_{command_type.split('.', 1)[1].replace('.', '_')}")
        try:
            return method(payload, progress)
        except ValueError as exc:
            raise CommandFailed("invalid_payload", str(exc)) from None
        except RayRuntimeError as exc:
            raise CommandFailed("internal", str(exc)) from None

    # ---- process runtime -----------------------------------------------------------------------

    def _runtime(self) -> RayProcessRuntime:
        if self.process_runtime is None:
            raise CommandFailed("unsupported", "this agent has no Ray process runtime (Ray not installed?)")
        return self.process_runtime

    def _load(self) -> dict[str, dict[str, Any]]:
        if self.state_path is None or not self.state_path.exists():
            return {}
        return json.loads(self.state_path.read_text() or "{}")

    def _save(self, members: dict[str, dict[str, Any]]) -> None:
        if self.state_path is not None:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(members))
            tmp.replace(self.state_path)

    def _load_containers(self) -> dict[str, dict[str, Any]]:
        if self.containers_path is None or not self.containers_path.exists():
            return {}
        return json.loads(self.containers_path.read_text() or "{}")

    def _remember_container(self, member_id: str, data: dict[str, Any] | None) -> None:
        if self.containers_path is None:
            return
        with self._lock:
            members = self._load_containers()
            if data is None:
                members.pop(member_id, None)
            else:
                members[member_id] = data
            self.containers_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.containers_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(members))
            tmp.replace(self.containers_path)

    def _member(self, member_id: str) -> RayNodeProcess | None:
        with self._lock:
            data = self._load().get(member_id)
        return RayNodeProcess(**data) if data else None

    def _remember(self, member_id: str, node: RayNodeProcess | None) -> None:
        with self._lock:
            members = self._load()
            if node is None:
                members.pop(member_id, None)
            else:
                members[member_id] = asdict(node)
            self._save(members)

    def _facts(self, node: RayNodeProcess) -> dict[str, Any]:
        return {
            "ray_node_id": node.node_id or "",
            "ip": node.gcs_address.rsplit(":", 1)[0] if node.role == "head" else "",
            "hostname": self.hostname,
            "container_id": "",
            "pid": node.pid,
            "gcs_address": node.gcs_address,
            "dashboard_url": node.dashboard_url or "",
        }

    def _running(self, member_id: str) -> RayNodeProcess | None:
        node = self._member(member_id)
        if node is not None and self._runtime().alive(node):
            return node
        return None

    def _num_cpus(self, requested: float) -> float:
        return requested or self.default_num_cpus or float(os.cpu_count() or 1)

    def _check_process_version(self, wanted: str) -> None:
        """The process runtime runs only the Ray installed next to the agent."""
        if self._process_version is None:
            self._process_version = self._runtime().installed_version()
        if wanted != self._process_version:
            raise CommandFailed(
                "unsupported",
                f"this agent's process runtime runs Ray {self._process_version}; Ray {wanted} needs the docker runtime",
            )

    def _process_head_start(self, p: protocol.RayHeadStartPayload, progress: ProgressFn) -> dict[str, Any]:
        self._check_process_version(p.ray_version)
        existing = self._running(p.member_id)
        if existing is not None:
            return {**self._facts(existing), "already_running": True}
        for port in (p.gcs_port, p.dashboard_port):
            if port_in_use(port):
                raise CommandFailed("conflict", f"port {port} is already in use on {self.hostname}")
        progress(f"starting Ray {p.ray_version} head (process) on port {p.gcs_port}")
        node = self._runtime().start_head(
            gcs_port=p.gcs_port,
            dashboard_port=p.dashboard_port,
            num_cpus=self._num_cpus(p.num_cpus),
            num_gpus=p.num_gpus or None,
            name=member_name(p.member_id),
            timeout=self.register_timeout_s,
        )
        self._remember(p.member_id, node)
        return self._facts(node)

    def _process_worker_start(self, p: protocol.RayWorkerStartPayload, progress: ProgressFn) -> dict[str, Any]:
        self._check_process_version(p.ray_version)
        existing = self._running(p.member_id)
        if existing is not None:
            return {**self._facts(existing), "already_running": True}
        progress(f"starting Ray {p.ray_version} worker (process) joining {p.head_address}")
        node = self._runtime().start_worker(
            head_address=p.head_address,
            num_cpus=self._num_cpus(p.num_cpus),
            num_gpus=p.num_gpus or None,
            dashboard_agent_listen_port=runtime.free_port(),
            name=member_name(p.member_id),
            timeout=self.register_timeout_s,
        )
        self._remember(p.member_id, node)
        return self._facts(node)

    def _process_node_stop(self, p: protocol.RayNodeStopPayload, progress: ProgressFn) -> dict[str, Any]:
        node = self._member(p.member_id)
        if node is None:
            return {"stopped": False, "reason": "no such Ray node on this machine"}
        progress(f"stopping Ray {node.role} {node.name}")
        self._runtime().stop(node, grace_s=float(p.timeout_s))
        self._remember(p.member_id, None)
        return {"stopped": True}

    def _head_address(self, head_member_id: str, gcs_port: int) -> str:
        head = self._member(head_member_id) if head_member_id else None
        return head.gcs_address if head is not None else f"127.0.0.1:{gcs_port}"

    def _process_node_drain(self, p: protocol.RayNodeDrainPayload, progress: ProgressFn) -> dict[str, Any]:
        address = self._head_address(p.head_member_id, p.gcs_port)
        progress(f"draining Ray node {p.ray_node_id[:12]} through {address}")
        accepted, message = self._runtime().drain_worker(
            p.ray_node_id, address=address, reason="idle", message=p.reason, deadline_s=p.deadline_s or None
        )
        if not accepted:
            raise CommandFailed("conflict", f"Ray refused the drain: {message}")
        return {"accepted": True}

    def _process_status(self, p: protocol.RayStatusPayload, progress: ProgressFn) -> dict[str, Any]:
        head = self._member(p.member_id)
        if head is None or not self._runtime().alive(head):
            raise CommandFailed("not_found", f"the Ray head {member_name(p.member_id)} is not running here")
        try:
            status = self._runtime().cluster_status(head.gcs_address)
        except Exception as exc:
            raise CommandFailed("internal", f"cannot read the cluster status: {exc}") from None
        result = normalize_status(status.as_dict())
        if p.include_logs:
            logs_dir = Path(head.temp_dir) / "session_latest" / "logs"
            result["logs"] = {
                key: _tail_lines(_read(logs_dir / filename), p.log_lines) for key, filename in LOG_FILES.items()
            }
        return result

    # ---- kuberay runtime -----------------------------------------------------------------------

    def _kuberay_backend(self) -> Any:
        if self.kuberay is None:
            raise CommandFailed(
                "unsupported", "KubeRay clusters need a kubernetes or argocd compute cluster; this node is standalone"
            )
        return self.kuberay

    def _kuberay_head_start(self, p: protocol.RayHeadStartPayload, progress: ProgressFn) -> dict[str, Any]:
        return self._kuberay_backend().apply(p, progress)

    def _kuberay_worker_start(self, p: protocol.RayWorkerStartPayload, progress: ProgressFn) -> dict[str, Any]:
        raise CommandFailed("unsupported", "KubeRay's autoscaler starts the workers of a RayCluster")

    def _kuberay_node_drain(self, p: protocol.RayNodeDrainPayload, progress: ProgressFn) -> dict[str, Any]:
        raise CommandFailed("unsupported", "KubeRay's autoscaler drains the workers of a RayCluster")

    def _kuberay_node_stop(self, p: protocol.RayNodeStopPayload, progress: ProgressFn) -> dict[str, Any]:
        backend = self._kuberay_backend()
        if p.delete:
            return backend.delete(p.cluster_id, progress)
        return backend.suspend(p.cluster_id, progress)

    def _kuberay_status(self, p: protocol.RayStatusPayload, progress: ProgressFn) -> dict[str, Any]:
        return self._kuberay_backend().status(p)

    # ---- docker runtime ------------------------------------------------------------------------

    def _engine(self) -> RayContainers:
        if self.containers is None:
            raise CommandFailed("docker_unavailable", "this agent has no container engine for Ray")
        return self.containers

    def docker_spec(self, p: protocol.RayHeadStartPayload | protocol.RayWorkerStartPayload) -> dict[str, Any]:
        """The container for a head or worker start: the payload's image, host network.

        On the host network every port a Ray node binds is a port of the machine: the head takes the GCS and
        dashboard ports the control plane chose; the per-node ports Ray would otherwise fix (client server
        10001, dashboard agent 52365), and the agent ports of Ray releases that draw them racily
        (`runtime.agent_ports_need_pinning`), are picked free here, outside the ephemeral range, and the
        node's workers get their own port window (`runtime.worker_port_window`), so several Ray nodes can
        share a machine. The
        dashboard listens on loopback only: the control plane reaches it through this agent's tunnel.
        """
        is_head = isinstance(p, protocol.RayHeadStartPayload)
        ports = {"dashboard_agent_listen": runtime.free_port()}
        if runtime.agent_ports_need_pinning(p.ray_version):
            ports.update({key: runtime.free_port() for key in runtime.AGENT_PORTS})
        window = runtime.worker_port_window()
        if window:
            ports.update(min_worker=window[0], max_worker=window[1])
        if is_head:
            ports.update(gcs=p.gcs_port, dashboard=p.dashboard_port, client_server=runtime.free_port())
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
        return spec

    def _in_container(self, name: str, args: list[str], what: str, timeout_s: float = 60.0) -> dict[str, Any]:
        code, output = self._engine().exec(name, ["python", "-c", in_container_script(), *args], timeout_s=timeout_s)
        return _script_json(code, output, what)

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
        last = [line for line in self._engine().logs(name, lines=30).splitlines() if line.strip()]
        raise CommandFailed(
            "internal",
            f"the Ray {role} container exited with code {state.get('ExitCode')}: "
            f"{short_reason(last[-1]) if last else 'no output'}",
        )

    def _start_container(self, spec: dict[str, Any], role: str, wait: Any) -> tuple[str, Any]:
        """Run `spec`, then `wait()` until the Ray node is up; on failure nothing is left behind."""
        self._check_memory(role)
        container_id = self._engine().run(spec)
        try:
            return container_id, wait()
        except BaseException:
            with contextlib.suppress(CommandFailed):
                self._engine().stop(spec["name"], timeout_s=5)
            raise

    def _wait_joined(self, head_name: str, member_id: str, gcs_port: int) -> dict[str, Any]:
        deadline = time.monotonic() + self.register_timeout_s
        last = ""
        while time.monotonic() < deadline:
            self._check_running(head_name, "head")
            try:
                status = normalize_status(self._in_container(head_name, ["status", str(gcs_port)], "ray status"))
            except CommandFailed as exc:
                last = exc.message
            else:
                found = next((n for n in status["nodes"] if n["member_id"] == member_id), None)
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

    def _docker_head_start(self, p: protocol.RayHeadStartPayload, progress: ProgressFn) -> dict[str, Any]:
        name = member_name(p.member_id)
        state = self._engine().state(name)
        if state is None or not state.get("Running"):
            for port in (p.gcs_port, p.dashboard_port):
                if port_in_use(port):
                    raise CommandFailed("conflict", f"port {port} is already in use on {self.hostname}")
        spec = self.docker_spec(p)
        progress(f"starting Ray head container {spec['name']} ({spec['image']})")
        container_id, joined = self._start_container(
            spec, "head", lambda: self._wait_joined(spec["name"], p.member_id, p.gcs_port)
        )
        dashboard_url = f"http://127.0.0.1:{p.dashboard_port}"
        self._remember_container(p.member_id, {"role": "head", "dashboard_url": dashboard_url})
        return {
            "container_id": container_id,
            "ray_node_id": joined["ray_node_id"],
            "ip": joined["ip"],
            "hostname": self.hostname,
            "gcs_address": f"{joined['ip']}:{p.gcs_port}",
            "dashboard_url": dashboard_url,
        }

    def _docker_worker_start(self, p: protocol.RayWorkerStartPayload, progress: ProgressFn) -> dict[str, Any]:
        spec = self.docker_spec(p)
        progress(f"starting Ray worker container {spec['name']} ({spec['image']}) joining {p.head_address}")
        container_id, _ = self._start_container(spec, "worker", lambda: self._wait_started(spec["name"]))
        self._remember_container(p.member_id, {"role": "worker", "dashboard_url": ""})
        # The worker's node id is learnt from the head's status (the next ray.status matches it by label).
        return {"container_id": container_id, "ray_node_id": "", "ip": "", "hostname": self.hostname}

    def _docker_node_stop(self, p: protocol.RayNodeStopPayload, progress: ProgressFn) -> dict[str, Any]:
        name = member_name(p.member_id)
        progress(f"stopping Ray container {name}")
        stopped = self._engine().stop(name, timeout_s=p.timeout_s)
        self._remember_container(p.member_id, None)
        return {"stopped": stopped}

    def _docker_node_drain(self, p: protocol.RayNodeDrainPayload, progress: ProgressFn) -> dict[str, Any]:
        head_name = member_name(p.head_member_id)
        progress(f"draining Ray node {p.ray_node_id[:12]} through {head_name}")
        answer = self._in_container(
            head_name, ["drain", str(p.gcs_port), p.ray_node_id, p.reason, str(p.deadline_s)], "ray drain"
        )
        if not answer.get("accepted"):
            raise CommandFailed("conflict", f"Ray refused the drain: {answer.get('message', '')}")
        return {"accepted": True}

    def _docker_status(self, p: protocol.RayStatusPayload, progress: ProgressFn) -> dict[str, Any]:
        head_name = member_name(p.member_id)
        result = normalize_status(self._in_container(head_name, ["status", str(p.gcs_port)], "ray status"))
        if p.include_logs:
            logs: dict[str, str] = {}
            for key, filename in LOG_FILES.items():
                path = f"{CONTAINER_RAY_DIR}/session_latest/logs/{filename}"
                _, output = self._engine().exec(head_name, ["tail", "-n", str(p.log_lines), path], timeout_s=15)
                logs[key] = output
            result["logs"] = logs
        return result


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def default_handler(work_dir: Path, *, ray_bin: Path | None = None, executor: Any = None) -> RayCommandHandler:
    """The handler an agent wires in: the process runtime when Ray is installed next to the agent, the
    docker runtime on the engine at DOCKER_HOST (connected on first use: an engine that is down then
    fails those commands with `docker_unavailable`), and KubeRay through `executor` on kubernetes and
    argocd clusters.

    Ray containers get ``CLEVERTHIS_RAY_MEMORY`` as their memory limit (e.g. ``8g``; none by default) and
    ``CLEVERTHIS_RAY_SHM_SIZE`` of /dev/shm for the object store (default ``2g``). ``CLEVERTHIS_RAY_NODE_IP``
    is the address this node's Ray nodes (containers and processes) advertise to the others; unset, Ray
    uses the address of the interface its default route goes through, which is wrong on a machine whose
    cluster network is not the one its default route takes.
    """
    import shutil

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
    )

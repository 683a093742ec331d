"""A rank of a multi-node endpoint run inside a Ray node's container (`EndpointGroup.container`).

When the control plane names the container of the Ray node a rank belongs to, the agent starts the rank
with ``exec`` in that container, through the same engine client the docker runtime runs the Ray containers
with (`agent.ray.containers.RayContainers`), so the rank lives and dies with that Ray node. The container's
own python runs vLLM (the image carries it: `.ci/ray-vllm-image`, settings.RAY_VLLM_IMAGE_TEMPLATE); the
in-container side is `agent.workloads.rank_incontainer`, sent as a ``python -c`` program, so nothing of the
agent is installed in the image. A follower's CLI shim (`agent.workloads.vllm_cli`) is written into the
container beside its log.

The Ray containers run on the host network (`agent.ray.docker_spec`), so the leader's port is a port of the
node: the proxy, the readiness wait and the health probes reach it on 127.0.0.1 as for a rank of the agent's
own. The model's snapshot must be visible at the same path inside the container: the docker runtime mounts
the agent's model cache read-only (`DockerBackend(model_dir=…)`); a rank whose weights the container cannot
see, whose image has no vLLM, or whose agent has no container engine is refused before anything starts.
`ContainerHost` is this path of `agent.workloads.server_host.ServerHost`.
"""

from __future__ import annotations

import base64
import json
import time
from importlib import resources
from pathlib import Path
from typing import Any

from agent.errors import CommandFailed
from agent.ray.containers import RayContainers, short_reason
from agent.workloads.distributed import CLI_MODULE
from agent.workloads.engine import VLLM_MODULE, Engine
from agent.workloads.server_host import Launch

MARKER = "RANKJSON"
RANK_DIR = "/tmp/cleverthis-ranks"  # inside the container: each rank's log, exit status and the CLI shim
EXEC_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 1.0  # the least time between two looks at a starting rank (each look is one exec)
LOG_CHUNK = 256 * 1024  # the most log bytes one look copies back
# Looks at a rank that may fail in a row while its container runs before the rank counts as gone: Podman's exec
# sometimes answers exit 0 with no output under load (seen in the container e2e test: the leader's start failed
# "exited with status -9" while its server still ran).
LOOK_RETRIES = 3
# What of the rank's environment goes into the container: vLLM's, the Hub's, the threads' and the GPUs'
# settings; the agent's own environment (paths of this host, its marks) stays out.
PASSED_ENV = ("VLLM_", "HF_", "TRANSFORMERS_", "OMP_", "CUDA_", "NCCL_", "GLOO_", "TORCH_")


def program() -> str:
    """The ``python -c`` program run in the container (`agent.workloads.rank_incontainer`'s source)."""
    return resources.files("agent.workloads").joinpath("rank_incontainer.py").read_text(encoding="utf-8")


def container_engine(engine: Engine) -> Engine:
    """The engine of a rank inside a Ray container: the container's python runs vLLM, on the node's device."""
    return Engine(["python", "-m", VLLM_MODULE], engine.device)


def rank_name(endpoint_id: str) -> str:
    """The name of an endpoint's rank in a container: its log, exit status and mark are named after it."""
    return f"endpoint-{endpoint_id}"


def container_env(env: dict[str, str], *, shim_root: str = "") -> dict[str, str]:
    """The part of a rank's environment that applies inside the container (`PASSED_ENV`); with `shim_root`
    (a follower) the CLI shim is found there."""
    passed = {key: value for key, value in env.items() if key.startswith(PASSED_ENV)}
    if shim_root:
        passed["PYTHONPATH"] = shim_root
    return passed


def shim_files(root: str) -> dict[str, str]:
    """The follower's CLI shim (`agent.workloads.vllm_cli`) as files under `root`: its packages' empty
    markers, then the module."""
    source = resources.files("agent.workloads").joinpath("vllm_cli.py").read_text(encoding="utf-8")
    parts = CLI_MODULE.split(".")
    files = {f"{root}/{'/'.join(parts[: depth + 1])}/__init__.py": "" for depth in range(len(parts) - 1)}
    files[f"{root}/{'/'.join(parts)}.py"] = source
    return files


class ContainerRanks:
    """Start, watch and end ranks inside containers of `containers` (None: this agent has no engine)."""

    def __init__(
        self, containers: RayContainers | None, *, poll_interval_s: float = POLL_INTERVAL_S, rank_dir: str = RANK_DIR
    ) -> None:
        self.containers = containers
        self.poll_interval_s = poll_interval_s
        self.rank_dir = rank_dir  # inside the containers

    def check(self, container: str) -> None:
        """CommandFailed when a rank cannot run in `container`: no engine here, or none answering
        (`unsupported`), or the container is not running on this node (`not_found`)."""
        if self.containers is None:
            raise CommandFailed(
                "unsupported",
                f"this agent runs no container engine, so it cannot start the rank inside the Ray node's "
                f"container {container} (only the docker runtime runs Ray nodes as containers)",
                container=container,
            )
        try:
            state = self.containers.state(container)
        except CommandFailed as exc:
            if exc.code != "docker_unavailable":
                raise
            raise CommandFailed(
                "unsupported",
                f"this node's container engine does not answer ({exc.message}), so the rank cannot start inside "
                f"the Ray node's container {container}",
                container=container,
            ) from None
        if state is None or not state.get("Running", False):
            raise CommandFailed(
                "not_found",
                f"the Ray node's container {container} is not running on this node",
                container=container,
            )

    def start(
        self,
        container: str,
        argv: list[str],
        env: dict[str, str],
        *,
        name: str,
        token: str,
        need: list[str],
        log_path: Path,
        follower: bool = False,
    ) -> ContainerProcess:
        """Start `argv` in `container` as rank `name` (its log and exit status are named after it) with the
        part of `env` that applies there (`container_env`; a `follower` gets the CLI shim); `need`: paths the
        container must see (the model snapshot); `token`: what the rank's command line names (`alive`). Its
        output is mirrored to `log_path`."""
        shim_root = f"{self.rank_dir}/python"
        spec = {
            "argv": argv,
            "env": container_env(env, shim_root=shim_root if follower else ""),
            "mark": name,
            "log": f"{self.rank_dir}/{name}.log",
            "exit_file": f"{self.rank_dir}/{name}.exit",
            "files": shim_files(shim_root) if follower else {},
            "need": need,
            "modules": ["vllm"],
        }
        answer = self._run(container, "start", spec)
        if answer.get("error") == "missing":
            raise CommandFailed(
                "unsupported",
                f"the Ray node's container {container} does not see {answer.get('path')}: the rank needs this "
                "node's model cache mounted at the same path (Ray containers the docker runtime starts with "
                "the agent's model cache do; restart the Ray node)",
                container=container,
            )
        if answer.get("error") == "no_module":
            raise CommandFailed(
                "unsupported",
                f"the Ray node's container {container} has no vLLM (its image must carry it: the cluster's "
                "Ray version needs the image settings.RAY_VLLM_IMAGE_TEMPLATE names)",
                container=container,
            )
        return ContainerProcess(self, container, int(answer["pid"]), token=token, name=name, log_path=log_path)

    def alive(self, container: str, pid: int, token: str) -> bool:
        """Whether rank `pid` still runs in `container` (False when the container is gone or stopped). A look
        the engine loses while the container runs is taken again (`LOOK_RETRIES` times)."""
        for _ in range(LOOK_RETRIES + 1):
            try:
                return bool(self._run(container, "poll", {"pid": pid, "token": token, "exit_file": ""}).get("alive"))
            except CommandFailed:
                if not self.running(container):
                    return False
        return False

    def running(self, container: str) -> bool:
        """Whether the engine says `container` runs (False when it does not answer)."""
        try:
            state = self.containers.state(container) if self.containers is not None else None
        except CommandFailed:
            return False
        return bool(state and state.get("Running", False))

    def stop(self, container: str, pid: int, *, name: str, timeout_s: float) -> None:
        """End every process of rank `name` (pid `pid`) in `container`: its session and whatever carries its
        mark (SIGTERM, SIGKILL after `timeout_s`); a container that is gone has ended it already."""
        spec = {"pid": pid, "mark": name, "timeout_s": timeout_s}
        try:
            self._run(container, "stop", spec, timeout_s=timeout_s + EXEC_TIMEOUT_S)
        except CommandFailed as exc:
            if exc.code != "not_found":
                raise

    def poll(self, container: str, pid: int, *, token: str, name: str, offset: int) -> dict[str, Any]:
        """One look at a rank: alive, exit status (None while it runs) and its log bytes from `offset`."""
        spec = {
            "pid": pid,
            "token": token,
            "log": f"{self.rank_dir}/{name}.log",
            "exit_file": f"{self.rank_dir}/{name}.exit",
        }
        return self._run(container, "poll", {**spec, "offset": offset, "max": LOG_CHUNK})

    def _run(
        self, container: str, action: str, spec: dict[str, Any], timeout_s: float = EXEC_TIMEOUT_S
    ) -> dict[str, Any]:
        if self.containers is None:
            raise CommandFailed("unsupported", "this agent runs no container engine")
        argv = ["python", "-c", program(), action, json.dumps(spec)]
        code, output = self.containers.exec(container, argv, timeout_s=timeout_s)
        for line in reversed(output.splitlines()):
            if line.startswith(MARKER):
                return json.loads(line[len(MARKER) :])
        raise CommandFailed(
            "not_found" if code else "internal",
            f"the rank's {action} in container {container} failed (exit {code}): {short_reason(output[-1500:])}",
            container=container,
        )


class ContainerProcess:
    """A rank started in a container, watched like a child process (`pid`, `poll()`): each look (at most one
    per `poll_interval_s`) appends the rank's new output to the agent's log file for it."""

    def __init__(
        self, ranks: ContainerRanks, container: str, pid: int, *, token: str, name: str, log_path: Path
    ) -> None:
        self.ranks, self.container, self.pid = ranks, container, pid
        self.token, self.name, self.log_path = token, name, log_path
        self.returncode: int | None = None
        self._offset = 0
        self._looked = 0.0
        self._failed_looks = 0  # looks in a row that failed while the container ran
        log_path.write_bytes(b"")

    def poll(self) -> int | None:
        """None while the rank runs; its exit status once it ended (-9 when its container is gone)."""
        if self.returncode is not None or time.monotonic() - self._looked < self.ranks.poll_interval_s:
            return self.returncode
        self._looked = time.monotonic()
        try:
            answer = self.ranks.poll(self.container, self.pid, token=self.token, name=self.name, offset=self._offset)
        except CommandFailed as exc:
            if self._failed_looks < LOOK_RETRIES and self.ranks.running(self.container):
                # The container runs: the engine lost this look (an exec answering nothing, under load).
                self._failed_looks += 1
                return None
            self._append(f"\n[agent] the Ray node's container {self.container} is gone: {exc.message}\n".encode())
            self.returncode = -9
            return self.returncode
        self._failed_looks = 0
        data = base64.b64decode(answer.get("data", ""))
        self._offset = int(answer.get("offset", self._offset))
        self._append(data)
        if not answer.get("alive"):
            code = answer.get("exit")
            self.returncode = int(code) if code is not None else -9
        return self.returncode

    def _append(self, data: bytes) -> None:
        if data:
            with self.log_path.open("ab") as log:
                log.write(data)


class ContainerHost:
    """Rank `rank` of an endpoint inside the Ray node's container `container` (`ServerHost`)."""

    local = False  # a rank's pid is a pid of its container

    def __init__(self, ranks: ContainerRanks, container: str, rank: str) -> None:
        self.ranks, self.container, self.rank = ranks, container, rank

    def prepare(self, engine: Engine, model_path: Path) -> tuple[Engine, Path]:
        """The image's vLLM (`container_engine`) and the snapshot's real path (the cache is mounted as itself);
        CommandFailed when the container cannot run the rank (`ContainerRanks.check`)."""
        self.ranks.check(self.container)
        return container_engine(engine), model_path.resolve()

    def start(self, launch: Launch) -> ContainerProcess:
        """`ContainerRanks.start`: the container must see the model snapshot; no cores are bound there."""
        return self.ranks.start(
            self.container,
            launch.argv,
            launch.env,
            name=self.rank,
            token=launch.token,
            need=[str(launch.model_path)],
            log_path=launch.log_path,
            follower=launch.follower,
        )

    def fields(self) -> dict[str, Any]:
        """The container and the rank's name."""
        return {"container": self.container, "rank": self.rank}

    def alive(self, record: dict[str, Any]) -> bool:
        """`ContainerRanks.alive`, by the token the record's command line names."""
        token = str(record.get("argv_token", record.get("port")))
        return self.ranks.alive(self.container, record.get("pid", 0), token)

    def stop(self, pid: int, *, timeout_s: float) -> None:
        """`ContainerRanks.stop`."""
        self.ranks.stop(self.container, pid, name=self.rank, timeout_s=timeout_s)

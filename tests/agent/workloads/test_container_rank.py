"""A rank run inside a Ray node's container (`agent.workloads.container_rank`), without a container engine.

The "container" here is this machine: a `RayContainers` whose exec runs its argv here, with a ``python`` on
the PATH that has a stand-in vLLM package on its path (its OpenAI server is `tests.support.openai_standin`,
its CLI prints its arguments and waits), so the in-container program (`agent.workloads.rank_incontainer`)
runs for real: the rank in a session of its own, its log mirrored to the agent's log file, its liveness by
its command line, its stop ending its session, the container's death ending it. The refusals come before
anything starts: no engine, a container not running, an image without vLLM, weights the container cannot see.
The real thing (Podman, the vLLM-carrying Ray image, real vLLM) is `test_ray_container_ranks.py`.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from agent.errors import CommandFailed
from agent.protocol import EndpointGroup, EndpointStartPayload, EndpointStopPayload, ModelDownloadPayload
from agent.workloads.container_rank import MARKER, ContainerRanks, container_engine, container_env, shim_files
from agent.workloads.distributed import CLI_MODULE
from agent.workloads.endpoints import EndpointManager
from agent.workloads.engine import VLLM_MODULE, Engine
from agent.workloads.models import ModelCache
from agent.workloads.server_process import free_port
from tests.support.hub_standin import HubStandin
from tests.support.processes import REPO_ROOT
from tests.support.vllm_group import quiet

MODEL = "acme/tiny-llama"
CONTAINER = "ray-0000aaaa"
# This machine is the "container" of every run at once: a rank's stop ends whatever carries its mark, so
# each run's endpoint ids (the marks' names) are its own, and only its own marks are counted as its ranks.
RUN = secrets.token_hex(4)
# vLLM's server as the stand-in with an engine child in a session of its own (the worst case for a stop)
STANDIN_SERVER = (
    "import sys\nfrom tests.support.openai_standin import main\nsys.exit(main([*sys.argv[1:], '--engine-child']))\n"
)
STANDIN_CLI = (
    "import os, sys, time\n"
    "def main():\n"
    "    print('cli argv', sys.argv, 'path', os.environ.get('PYTHONPATH'), flush=True)\n"
    "    time.sleep(3600)\n"
)


class LocalContainers:
    """`RayContainers` whose containers are this machine: exec runs here with a ``python`` that has the
    stand-in vLLM (`vllm` True) or none; `kill` ends every rank started in a container, as its death would."""

    def __init__(self, root: Path, *, vllm: bool = True) -> None:
        bin_dir, package = root / "bin", root / "site"
        bin_dir.mkdir(parents=True)
        python = bin_dir / "python"
        # the image's python: its site-packages (the stand-in vLLM, and this repository for the stand-in's
        # server) come after whatever PYTHONPATH the rank sets
        site = f"{package}:{REPO_ROOT}"
        python.write_text(f'#!/bin/sh\nPYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site}" exec {sys.executable} "$@"\n')
        python.chmod(0o755)
        if vllm:
            for module, source in {
                "vllm/entrypoints/openai/api_server.py": STANDIN_SERVER,
                "vllm/entrypoints/cli/main.py": STANDIN_CLI,
            }.items():
                path = package / module
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(source)
                for parent in path.relative_to(package).parents:
                    if str(parent) != ".":
                        (package / parent / "__init__.py").touch()
        package.mkdir(exist_ok=True)
        self.root = root
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        self.env.pop("PYTHONPATH", None)
        self.running = {CONTAINER}
        self.sessions: list[int] = []
        self.execs: list[list[str]] = []

    def state(self, name: str) -> dict[str, Any] | None:
        return {"Running": True, "Status": "running"} if name in self.running else None

    def exec(self, name: str, argv: list[str], *, timeout_s: float) -> tuple[int, str]:
        if name not in self.running:
            raise CommandFailed("not_found", f"container {name} does not exist")
        self.execs.append(argv)
        done = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=timeout_s, cwd=self.root)
        output = done.stdout + done.stderr
        if argv[3] == "start" and f'{MARKER}{{"pid"' in output:
            self.sessions.append(int(output.rsplit('"pid": ', 1)[1].split("}")[0]))
        return done.returncode, output

    def kill(self, name: str) -> None:
        """The container dies: every process of the ranks started in it."""
        self.running.discard(name)
        for proc in rank_processes(self.sessions, self.root.parent):
            proc.kill()

    def run(self, spec: dict[str, Any]) -> str:  # pragma: no cover - not used by ranks
        raise NotImplementedError

    def stop(self, name: str, *, timeout_s: int) -> bool:  # pragma: no cover - not used by ranks
        raise NotImplementedError

    def logs(self, name: str, *, lines: int) -> str:  # pragma: no cover - not used by ranks
        return ""


def endpoint_id(letter: str) -> str:
    """This run's endpoint id of 12 characters named by `letter`."""
    return f"{RUN}{letter * 4}"


def rank_processes(sessions: list[int], root: Path) -> list[psutil.Process]:
    """The living processes of these sessions, and those carrying the mark of a rank this test started (an
    engine child that left): its exit file under `root`. Never another rank's: a real one inside a Ray
    container is a process of this machine too (a test beside this one, or a node's agent)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if os.getsid(proc.pid) in sessions or (
                sessions and "CLEVERTHIS_RANK" in (env := proc.environ()) and _under(env.get("RANK_EXIT_FILE"), root)
            ):
                found.append(proc)
        except (OSError, psutil.Error):
            continue
    return found


def _under(path: str | None, root: Path) -> bool:
    return bool(path) and Path(path).resolve().is_relative_to(root.resolve())


def down(name: str) -> None:
    raise CommandFailed("docker_unavailable", "the container engine is not answering: connection refused")


@pytest.fixture
def cache(tmp_path: Path) -> ModelCache:
    hub = HubStandin().start()
    hub.add_repo(MODEL, {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"\0" * 1024})
    cache = ModelCache(tmp_path / "models", endpoint=hub.url)
    cache.download(ModelDownloadPayload(model_id=MODEL), quiet)
    hub.stop()
    return cache


def manager_for(cache: ModelCache, root: Path, containers: LocalContainers | None) -> EndpointManager:
    manager = EndpointManager(cache, root / "state", containers=containers, ready_timeout_s=30, stop_timeout_s=5)
    manager.ranks = ContainerRanks(containers, poll_interval_s=0.1, rank_dir=str(root / "in-container"))
    return manager


@pytest.fixture
def local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalContainers]:
    monkeypatch.setenv("CLEVERTHIS_VLLM_DEVICE", "cpu")
    monkeypatch.delenv("CLEVERTHIS_ENDPOINT_SERVER", raising=False)
    containers = LocalContainers(tmp_path / "container")
    yield containers
    for proc in rank_processes(containers.sessions, tmp_path):
        proc.kill()


def group(**extra: Any) -> EndpointGroup:
    leader = {"pipeline_parallel": 2, "nnodes": 2, "master_addr": "127.0.0.1", "master_port": free_port()}
    return EndpointGroup(**{**leader, "container": CONTAINER, **extra})


def test_the_rank_in_a_container_runs_the_images_python_with_only_the_environment_that_applies_there():
    engine = container_engine(Engine(["/host/venv/bin/python", "-m", VLLM_MODULE], "cpu"))
    assert engine == Engine(["python", "-m", VLLM_MODULE], "cpu")
    env = {
        "PATH": "/host",
        "HOME": "/root",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    env |= {"CLEVERTHIS_ENDPOINT_ID": "e" * 12, "PYTHONPATH": "/host/agent"}
    assert container_env(env) == {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    assert container_env(env, shim_root="/r/python")["PYTHONPATH"] == "/r/python"
    files = shim_files("/r/python")
    assert sorted(files) == [
        "/r/python/agent/__init__.py",
        "/r/python/agent/workloads/__init__.py",
        "/r/python/agent/workloads/vllm_cli.py",
    ]
    assert "def version(name: str)" in files["/r/python/agent/workloads/vllm_cli.py"]


@pytest.mark.parametrize(
    ("how", "code", "words"),
    [
        ("no engine", "unsupported", "runs no container engine"),
        ("engine down", "unsupported", "container engine does not answer"),
        ("not running", "not_found", f"container {CONTAINER} is not running on this node"),
        ("no vllm", "unsupported", "has no vLLM"),
        ("no weights", "unsupported", "does not see"),
    ],
)
def test_a_rank_the_container_cannot_run_is_refused_before_anything_starts(
    cache, tmp_path, monkeypatch, how, code, words
):
    monkeypatch.setenv("CLEVERTHIS_VLLM_DEVICE", "cpu")
    containers = None if how == "no engine" else LocalContainers(tmp_path / "container", vllm=how != "no vllm")
    if how == "not running":
        containers.running.clear()
    if how == "engine down":  # the process runtime's nodes: DOCKER_HOST answers nothing
        containers.state = down  # type: ignore[method-assign]
    manager = manager_for(cache, tmp_path, containers)
    payload = EndpointStartPayload(endpoint_id=endpoint_id("c"), model_id=MODEL, group=group())
    if how == "no weights":  # a container without the model cache mounted: the snapshot's path is not there
        original = manager.ranks.start

        def elsewhere(*args: Any, **kwargs: Any) -> Any:
            return original(*args, **{**kwargs, "need": [str(tmp_path / "not-mounted" / "snapshot")]})

        manager.ranks.start = elsewhere  # type: ignore[method-assign]
    with pytest.raises(CommandFailed) as failed:
        manager.start(payload, quiet)
    assert failed.value.code == code
    assert words in str(failed.value)
    assert manager.inventory() == []
    assert containers is None or containers.sessions == []


def test_a_leader_rank_in_the_container_serves_on_the_nodes_port_and_dies_with_the_container(cache, tmp_path, local):
    manager = manager_for(cache, tmp_path, local)
    port = free_port()
    payload = EndpointStartPayload(endpoint_id=endpoint_id("d"), model_id=MODEL, port=port, group=group())
    result = manager.start(payload, quiet)
    assert result.port == port
    assert local.sessions == [result.pid]
    # the program started in the container is the image's vLLM server with the rank's flags
    cmdline = psutil.Process(result.pid).cmdline()
    assert cmdline[:4] == ["sh", "-c", cmdline[2], "rank"]
    assert cmdline[4:7] == ["python", "-m", VLLM_MODULE]
    assert cmdline[cmdline.index("--model") + 1] == str(cache.path_for(MODEL).resolve())
    assert cmdline[cmdline.index("--node-rank") + 1] == "0"
    assert "--enforce-eager" not in cmdline
    # the leader's port is the node's: the agent's readiness wait, inventory, probes and proxy reach it
    assert requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()["data"][0]["id"] == MODEL
    assert [(i.status, i.port) for i in manager.inventory()] == [("running", port)]
    assert manager.health_targets() == [(endpoint_id("d"), port)]
    assert manager.generation_probes() == {endpoint_id("d"): MODEL}
    log = (manager.state_dir / f"endpoint-{endpoint_id('d')}.log").read_text()
    assert f"openai-standin serving {MODEL}" in log  # the rank's output, mirrored from the container
    assert result.phases.model_loaded_s >= result.phases.server_started_s

    local.kill(CONTAINER)  # the Ray node's container dies, and the rank with it
    assert manager.inventory() == []
    assert manager.health_targets() == []
    assert manager.stop(EndpointStopPayload(endpoint_id=endpoint_id("d"))).status == "stopped"  # nothing left to end


def test_stop_ends_every_process_of_the_rank_in_its_container(cache, tmp_path, local):
    manager = manager_for(cache, tmp_path, local)
    result = manager.start(EndpointStartPayload(endpoint_id=endpoint_id("e"), model_id=MODEL, group=group()), quiet)
    processes = rank_processes(local.sessions, tmp_path)
    assert len(processes) == 3  # sh, the server, its engine child (in a session of its own)
    assert len({os.getsid(p.pid) for p in processes}) == 2
    manager.stop(EndpointStopPayload(endpoint_id=endpoint_id("e")))
    assert rank_processes([result.pid], tmp_path) == []
    assert manager.inventory() == []


def test_a_follower_rank_runs_the_cli_shim_written_into_the_container(cache, tmp_path, local, monkeypatch):
    monkeypatch.setattr("agent.workloads.readiness.FOLLOWER_SETTLE_S", 1.0)
    manager = manager_for(cache, tmp_path, local)
    follower = group(node_rank=1, role="follower")
    result = manager.start(EndpointStartPayload(endpoint_id=endpoint_id("f"), model_id=MODEL, group=follower), quiet)
    assert result.port == 0
    shim_root = f"{tmp_path}/in-container/python"
    log = (manager.state_dir / f"endpoint-{endpoint_id('f')}.log").read_text()
    assert "cli argv ['vllm', 'serve'" in log  # the shim ran vLLM's CLI main as `vllm serve`
    assert "'--headless'" in log
    assert f"path {shim_root}" in log
    assert [(i.status, i.port) for i in manager.inventory()] == [("running", 0)]
    cmdline = psutil.Process(result.pid).cmdline()
    assert cmdline[4:7] == ["python", "-m", CLI_MODULE]
    manager.stop(EndpointStopPayload(endpoint_id=endpoint_id("f")))
    assert rank_processes([result.pid], tmp_path) == []


def test_the_docker_runtime_mounts_the_model_cache_read_only_at_its_own_path_in_ray_containers(tmp_path):
    from agent import protocol
    from agent.ray.commands import RayCommandHandler

    payload = {
        "cluster_id": "c0ffee00-0000-4000-8000-0000000000f1",
        "member_id": "f1000000-0000-4000-8000-000000000001",
        "ray_version": "2.60.0",
        "image": "cleverthis/ray-vllm:2.60.0-vllm0.32.0",
        "runtime": "docker",
        "gcs_port": free_port(),
        "dashboard_port": free_port(),
    }
    head = protocol.parse_payload("ray.head.start", payload)
    models = tmp_path / "models"
    spec = RayCommandHandler(containers=LocalContainers(tmp_path / "c"), model_dir=models).docker.spec(head)
    assert spec["volumes"] == {str(models.resolve()): {"bind": str(models.resolve()), "mode": "ro"}}
    assert spec["network_mode"] == "host"  # the leader's port is the node's
    assert "volumes" not in RayCommandHandler(containers=LocalContainers(tmp_path / "d")).docker.spec(head)


class LosingLooks(LocalContainers):
    """The engine loses some looks at a rank (Podman's exec answering exit 0 and nothing, under load) while
    the container runs."""

    def __init__(self, root: Path, lose: int) -> None:
        super().__init__(root)
        self.lose = lose

    def exec(self, name: str, argv: list[str], *, timeout_s: float) -> tuple[int, str]:
        if argv[3] == "poll" and self.lose:
            self.lose -= 1
            return 0, ""
        return super().exec(name, argv, timeout_s=timeout_s)


def test_a_look_the_engine_loses_while_the_container_runs_is_taken_again(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("CLEVERTHIS_VLLM_DEVICE", "cpu")
    monkeypatch.delenv("CLEVERTHIS_ENDPOINT_SERVER", raising=False)
    engine = LosingLooks(tmp_path / "container", lose=2)
    manager = manager_for(cache, tmp_path, engine)
    try:
        port = free_port()
        payload = EndpointStartPayload(endpoint_id=endpoint_id("g"), model_id=MODEL, port=port, group=group())
        assert manager.start(payload, quiet).port == port  # not "exited with status -9"
        engine.lose = 1
        assert [i.status for i in manager.inventory()] == ["running"]  # not dropped
        engine.lose = 100
        assert manager.inventory() == []  # an engine losing every look: the rank counts as gone
    finally:
        for proc in rank_processes(engine.sessions, tmp_path):
            proc.kill()

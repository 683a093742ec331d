"""CommandRunner with real parts: ModelCache (Hub stand-in), EndpointManager (OpenAI stand-in process) and
a real executor — Docker via Podman when its socket exists, else the Kubernetes executor on its stand-in."""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent import protocol
from agent.executors.base import Executor
from agent.protocol import Command, Error, GpuInfo, Result
from agent.runner import CommandRunner, build_executor, result_data
from agent.workloads.endpoints import EndpointManager
from agent.workloads.models import ModelCache
from tests.agent.executors.podman import TEST_IMAGE, podman_url
from tests.support.hub_standin import HubStandin
from tests.support.processes import REPO_ROOT

MODEL = "acme/runner-model"
RUN_LABEL = "io.cleverthis.test-run"


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, message: str, percent: float | None = None, data: dict | None = None) -> None:
        self.calls.append(message)


@pytest.fixture
def run_id() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
def executor(run_id: str, tmp_path: Path) -> Iterator[Executor]:
    url = podman_url()
    if url is not None:
        import docker

        yield build_executor("standalone", {}, docker_url=url)
        client = docker.DockerClient(base_url=url)
        for container in client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"}):
            container.remove(force=True, v=True)
        client.close()
        return
    from tests.support.k8s_standin import K8sStandin

    standin = K8sStandin().start()
    yield build_executor("kubernetes", {}, kubeconfig=str(standin.write_kubeconfig(tmp_path / "kubeconfig")))
    standin.stop()


@pytest.fixture
def hub() -> Iterator[HubStandin]:
    standin = HubStandin().start()
    standin.add_repo(MODEL, {"config.json": b"{}", "model.safetensors": b"\1" * 4096})
    yield standin
    standin.stop()


@pytest.fixture
def parts(
    tmp_path: Path, hub: HubStandin, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ModelCache, EndpointManager]]:
    monkeypatch.chdir(REPO_ROOT)
    models = ModelCache(tmp_path / "models", endpoint=hub.url)
    endpoints = EndpointManager(
        models, tmp_path / "endpoints", server_command=[sys.executable, "-m", "tests.support.openai_standin"]
    )
    yield models, endpoints
    endpoints.stop_all()


@pytest.fixture
def runner(executor: Executor, parts: tuple[ModelCache, EndpointManager], tmp_path: Path) -> CommandRunner:
    models, endpoints = parts
    return CommandRunner(executor=executor, models=models, endpoints=endpoints, journal_path=tmp_path / "journal.jsonl")


def create_command(run_id: str, key: str) -> Command:
    payload = {
        "image": TEST_IMAGE,
        "name": f"rn-{run_id}-{uuid.uuid4().hex[:4]}",
        "command": ["sleep", "300"],
        "labels": {RUN_LABEL: run_id},
    }
    return Command(command_id=uuid.uuid4().hex, idempotency_key=key, command_type="container.create", payload=payload)


def ours(executor: Executor, key: str) -> list:
    return [c for c in executor.list_containers() if c.command_key == key]


def test_container_create_runs_once_per_key_even_across_restarts(runner, executor, parts, tmp_path, run_id):
    key = f"create-{run_id}"
    first = runner.run(create_command(run_id, key), Recorder())
    assert isinstance(first, Result)
    assert first.data["container_id"]

    again = create_command(run_id, key)
    repeated = runner.run(again, Recorder())
    assert repeated.data == first.data
    assert repeated.command_id == again.command_id
    assert len(ours(executor, key)) == 1

    models, endpoints = parts
    restarted = CommandRunner(
        executor=executor, models=models, endpoints=endpoints, journal_path=tmp_path / "journal.jsonl"
    )
    assert restarted.completed(key).data == first.data
    assert restarted.run(create_command(run_id, key), Recorder()).data == first.data
    assert len(ours(executor, key)) == 1
    assert key in restarted.inventory([]).completed_command_keys


def test_concurrent_deliveries_of_one_key_share_one_run(runner, executor, run_id):
    key = f"conc-{run_id}"
    outcomes: list[Result | Error] = []

    def deliver() -> None:
        outcomes.append(runner.run(create_command(run_id, key), Recorder()))

    threads = [threading.Thread(target=deliver) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({o.data["container_id"] for o in outcomes}) == 1
    assert len(ours(executor, key)) == 1


def test_documented_failures_become_error_frames_and_are_journaled(runner, run_id):
    stop = Command(
        command_id="c1", idempotency_key=f"stop-{run_id}", command_type="container.stop", payload={"container": "nope"}
    )
    outcome = runner.run(stop, Recorder())
    assert isinstance(outcome, Error)
    assert outcome.code == "not_found"
    assert runner.completed(f"stop-{run_id}") == outcome


def test_bad_payloads_and_unknown_commands(runner):
    bad = Command(command_id="c2", idempotency_key="bad", command_type="model.download", payload={"revision": "x"})
    outcome = runner.run(bad, Recorder())
    assert isinstance(outcome, Error)
    assert outcome.code == "invalid_payload"
    assert "model_id" in outcome.message
    unknown = Command(command_id="c3", idempotency_key="unk", command_type="node.explode", payload={})
    assert runner.run(unknown, Recorder()).code == "unknown_command"


def test_unexpected_exceptions_are_internal_errors(executor, parts, tmp_path):
    _, endpoints = parts
    (tmp_path / "not-a-dir").write_text("")
    broken = ModelCache(tmp_path / "not-a-dir", endpoint="http://127.0.0.1:9")
    runner = CommandRunner(executor=executor, models=broken, endpoints=endpoints, journal_path=tmp_path / "j.jsonl")
    download = Command(
        command_id="c4", idempotency_key="dl", command_type="model.download", payload={"model_id": "a/b"}
    )
    outcome = runner.run(download, Recorder())
    assert isinstance(outcome, Error)
    assert outcome.code == "internal"
    assert "FileExistsError" in outcome.message


class DictReturning:
    """The real executor, except that it hands back its result as a plain dict (the bug the runner refuses)."""

    def __init__(self, executor: Executor) -> None:
        self.inner = executor
        self.mode = executor.mode

    def execute(self, command_type: str, payload: Any, *, command_key: str, progress: Any) -> Any:
        return protocol.result_to_dict(
            self.inner.execute(command_type, payload, command_key=command_key, progress=progress)
        )

    def list_containers(self) -> list:
        return self.inner.list_containers()


def test_a_handler_returning_a_dict_instead_of_its_result_type_fails_the_command(executor, parts, tmp_path, run_id):
    models, endpoints = parts
    runner = CommandRunner(
        executor=DictReturning(executor), models=models, endpoints=endpoints, journal_path=tmp_path / "j.jsonl"
    )
    outcome = runner.run(create_command(run_id, f"dict-{run_id}"), Recorder())
    assert isinstance(outcome, Error)
    assert outcome.code == "internal"
    assert "container.create handler returned dict, not its ContainerResult" in outcome.message
    # the runner sends a result only as its command type's result type, and refuses another type's
    assert result_data("endpoint.stop", protocol.EndpointStopResult(endpoint_id="e1")) == {
        "endpoint_id": "e1",
        "status": "stopped",
    }
    with pytest.raises(TypeError, match="not its EndpointStopResult"):
        result_data("endpoint.stop", protocol.ContainerResult(container_id="x"))


def test_download_then_serve_then_inventory(runner, executor, run_id):
    progress = Recorder()
    download = Command(
        command_id="d", idempotency_key=f"dl-{run_id}", command_type="model.download", payload={"model_id": MODEL}
    )
    downloaded = runner.run(download, progress)
    assert isinstance(downloaded, Result)
    assert Path(downloaded.data["path"], "config.json").is_file()
    assert progress.calls

    start = Command(
        command_id="s",
        idempotency_key=f"ep-{run_id}",
        command_type="endpoint.start",
        payload={"endpoint_id": "e1e1e1e1e1e1", "model_id": MODEL},
    )
    started = runner.run(start, Recorder())
    assert isinstance(started, Result)
    assert set(started.data) == {"endpoint_id", "port", "pid", "device", "log_tail", "phases"}
    created = runner.run(create_command(run_id, f"c-{run_id}"), Recorder())

    gpus = [GpuInfo(index=0, name="test", memory_total_mb=1)]
    inventory = runner.inventory(gpus)
    assert [m.model_id for m in inventory.models] == [MODEL]
    assert [(e.endpoint_id, e.port) for e in inventory.endpoints] == [("e1e1e1e1e1e1", started.data["port"])]
    assert created.data["container_id"] in {c.container_id for c in inventory.containers}
    assert inventory.gpus == gpus
    assert {f"dl-{run_id}", f"ep-{run_id}", f"c-{run_id}"} <= set(inventory.completed_command_keys)

    stop = Command(
        command_id="t",
        idempotency_key=f"eps-{run_id}",
        command_type="endpoint.stop",
        payload={"endpoint_id": "e1e1e1e1e1e1"},
    )
    assert runner.run(stop, Recorder()).data["status"] == "stopped"
    assert runner.inventory([]).endpoints == []


def test_a_torn_journal_line_is_ignored(executor, parts, tmp_path):
    models, endpoints = parts
    journal = tmp_path / "torn.jsonl"
    journal.write_text('{"key":"k1","kind":"result","command_id":"a","data":{"x":1}}\n{"key":"k2","kind":"res')
    runner = CommandRunner(executor=executor, models=models, endpoints=endpoints, journal_path=journal)
    assert runner.completed("k1").data == {"x": 1}
    assert runner.completed("k2") is None


def test_build_executor_picks_the_mode(tmp_path):
    assert build_executor("standalone", {}, docker_url="unix:///x.sock").mode == "standalone"
    assert build_executor("kubernetes", {}, kubeconfig=str(tmp_path / "kc")).mode == "kubernetes"
    settings = {"repo_url": str(tmp_path / "repo.git"), "server": "http://127.0.0.1:9", "app_name": "app"}
    assert build_executor("argocd", settings, workdir=tmp_path / "wd").mode == "argocd"
    with pytest.raises(ValueError, match="repo_url"):
        build_executor("argocd", {}, workdir=tmp_path)
    with pytest.raises(ValueError, match="unknown orchestration mode"):
        build_executor("swarm", {})

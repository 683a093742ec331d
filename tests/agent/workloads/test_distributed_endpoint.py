"""Multi-node endpoints on the agent: one rank of a vLLM group (`agent.workloads.distributed`).

The command lines of a leader and a follower, the refusals (an inconsistent group, the Ray executor on a
CPU node, a follower without vLLM's CLI) with an OpenAI stand-in; then real vLLM (the CPU build, the tiny
Llama): pipeline parallel 2 over a leader and a headless follower, each started by its own
`EndpointManager` as two nodes' agents would, a completion through the leader's OpenAI API, and the
follower killed → its agent no longer lists it, the leader's own /health still answers (vLLM does not see a
rank die) but the agent's generation probe of the leader fails and it reports the endpoint unresponsive.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from agent.errors import CommandFailed
from agent.protocol import EndpointGroup, EndpointStartPayload, ModelDownloadPayload
from agent.protocol.validation import from_dict
from agent.workloads.distributed import CLI_MODULE
from agent.workloads.endpoint_health import EndpointProber, HealthSettings
from agent.workloads.endpoints import EndpointManager, server_argv
from agent.workloads.engine import VLLM_MODULE, Engine
from agent.workloads.models import ModelCache
from agent.workloads.server_process import pid_alive, process_tree
from tests.support.hub_standin import HubStandin
from tests.support.processes import REPO_ROOT, wait_until
from tests.support.vllm_group import quiet, start_pp2, tiny_model_cache

STANDIN = [sys.executable, "-m", "tests.support.openai_standin"]
MODEL = "acme/tiny-llama"
LEADER = EndpointGroup(pipeline_parallel=2, nnodes=2, master_addr="10.0.0.5", master_port=29500)
FOLLOWER = EndpointGroup(**{**LEADER.__dict__, "node_rank": 1, "role": "follower"})


def test_a_leader_serves_the_api_with_its_rank_and_a_follower_runs_vllms_cli_headless(tmp_path):
    engine = Engine(["/venv/bin/python", "-m", VLLM_MODULE], "cpu")
    model = tmp_path / "snap"
    leader = server_argv(engine, model, 8001, EndpointStartPayload(endpoint_id="a" * 12, model_id=MODEL, group=LEADER))
    rank = ["--pipeline-parallel-size", "2", "--distributed-executor-backend", "mp", "--nnodes", "2"]
    master = ["--master-addr", "10.0.0.5", "--master-port", "29500"]
    assert leader[:3] == engine.program
    assert leader[leader.index("--port") + 1] == "8001"
    assert leader[-(len(rank) + 6) :] == [*rank, "--node-rank", "0", *master]
    assert "--enforce-eager" not in leader  # PP on CPU is compiled (the eager runner's upstream bug)
    follower = server_argv(
        engine, model, 0, EndpointStartPayload(endpoint_id="a" * 12, model_id=MODEL, group=FOLLOWER, extra_args=["-x"])
    )
    assert follower[:5] == ["/venv/bin/python", "-m", CLI_MODULE, "serve", str(model)]
    assert follower[-(len(rank) + 8) :] == [*rank, "--node-rank", "1", *master, "--headless", "-x"]
    assert "--port" not in follower
    assert "--host" not in follower
    one_node = server_argv(engine, model, 8001, EndpointStartPayload(endpoint_id="a" * 12, model_id=MODEL, gpus=2))
    assert "--enforce-eager" in one_node
    assert one_node[-2:] == ["--tensor-parallel-size", "2"]
    ray = EndpointGroup(pipeline_parallel=2, tensor_parallel=4, backend="ray")
    gpu = server_argv(Engine(engine.program, "gpu"), model, 1, EndpointStartPayload("a" * 12, MODEL, group=ray))
    assert gpu[-6:] == [
        "--pipeline-parallel-size",
        "2",
        "--tensor-parallel-size",
        "4",
        "--distributed-executor-backend",
        "ray",
    ]


def test_the_group_travels_as_its_protocol_dataclass_and_its_rules_are_checked():
    data = {"endpoint_id": "b" * 12, "model_id": MODEL, "group": {**FOLLOWER.__dict__}}
    assert from_dict(EndpointStartPayload, data, where="p").group == FOLLOWER
    assert (
        from_dict(EndpointStartPayload, {"endpoint_id": "b" * 12, "model_id": MODEL}, where="p").group
        == EndpointGroup()
    )
    with pytest.raises(Exception, match="role"):
        from_dict(EndpointStartPayload, {**data, "group": {"role": "boss"}}, where="p")
    assert EndpointGroup().problems() == []
    assert not EndpointGroup().distributed
    assert FOLLOWER.problems() == []
    assert LEADER.problems() == []
    assert (
        EndpointGroup(nnodes=2, node_rank=2, role="follower", pipeline_parallel=2)
        .problems()[0]
        .startswith("node_rank 2")
    )
    assert "master_addr" in " ".join(EndpointGroup(nnodes=2, pipeline_parallel=2).problems())
    assert EndpointGroup(nnodes=2, pipeline_parallel=2, backend="ray").problems() == []  # Ray places the ranks
    assert "follower" in " ".join(EndpointGroup(role="follower").problems())
    assert "nnodes must not exceed" in " ".join(LEADER.__class__(nnodes=3, master_addr="h", master_port=1).problems())


@pytest.fixture
def manager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EndpointManager]:
    monkeypatch.chdir(REPO_ROOT)
    hub = HubStandin().start()
    hub.add_repo(MODEL, {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"\0" * 1024})
    cache = ModelCache(tmp_path / "models", endpoint=hub.url)
    cache.download(ModelDownloadPayload(model_id=MODEL), quiet)
    hub.stop()
    manager = EndpointManager(cache, tmp_path / "state", server_command=STANDIN, ready_timeout_s=30)
    yield manager
    manager.stop_all()


@pytest.mark.parametrize(
    ("group", "code", "words"),
    [
        (EndpointGroup(role="follower"), "invalid_payload", "every other rank is a follower"),
        (EndpointGroup(pipeline_parallel=2, backend="ray"), "unsupported", "current platform cpu does not support ray"),
        (FOLLOWER, "unsupported", "vLLM's own CLI"),
    ],
)
def test_a_group_this_node_cannot_run_is_refused_before_anything_starts(manager, group, code, words, monkeypatch):
    monkeypatch.setenv("CLEVERTHIS_VLLM_DEVICE", "cpu")
    with pytest.raises(CommandFailed) as failed:
        manager.start(EndpointStartPayload(endpoint_id="c" * 12, model_id=MODEL, group=group), quiet)
    assert failed.value.code == code
    assert words in str(failed.value)
    assert manager.inventory() == []
    assert not (manager.state_dir / "endpoints.json").exists()


# ---- real vLLM


@pytest.fixture(scope="module")
def engine_python() -> str:
    from tests.support.tiny_llm import require_vllm_python

    return require_vllm_python()


@pytest.fixture(scope="module")
def tiny_cache(engine_python: str, tmp_path_factory: pytest.TempPathFactory) -> ModelCache:
    return tiny_model_cache(tmp_path_factory.mktemp("tiny-llama"), engine_python, MODEL)


@pytest.mark.integration
@pytest.mark.timeout(1500)
def test_pipeline_parallel_2_over_a_leader_and_a_follower_then_the_follower_dies(
    tiny_cache, engine_python, tmp_path, monkeypatch
):
    monkeypatch.setenv("CLEVERTHIS_VLLM_CPU_PYTHON", engine_python)
    monkeypatch.setenv("CLEVERTHIS_VLLM_DEVICE", "cpu")
    monkeypatch.setenv("CLEVERTHIS_VLLM_MAX_MODEL_LEN", "256")
    group = start_pp2(tiny_cache, tmp_path, MODEL, "d" * 12, ready_timeout_s=1200)
    trees = []
    try:
        leader, follower = group.leader_result, group.follower_result
        assert follower.port == 0
        assert follower.pid != leader.pid
        follower_cmd = Path(f"/proc/{follower.pid}/cmdline").read_bytes().split(b"\0")
        assert b"--headless" in follower_cmd
        assert CLI_MODULE.encode() in follower_cmd
        base = f"http://127.0.0.1:{leader.port}"
        assert [m["id"] for m in requests.get(f"{base}/v1/models", timeout=60).json()["data"]] == [MODEL]
        body = {"model": MODEL, "prompt": "the fleet runs", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        answer = requests.post(f"{base}/v1/completions", json=body, timeout=300)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 8
        # the second pipeline stage ran in the follower: its log has the PP1 worker and the group's world size
        follower_log = (tmp_path / "follower" / f"endpoint-{'d' * 12}.log").read_text(errors="replace")
        assert "Worker_PP1" in follower_log
        assert "world_size=2 rank=1" in follower_log
        assert [i.status for i in group.leader.inventory()] == ["running"]
        assert [(i.status, i.port) for i in group.follower.inventory()] == [("running", 0)]
        assert group.leader.health_targets() == [("d" * 12, leader.port)]
        assert group.follower.health_targets() == []

        assert group.leader.generation_probes() == {"d" * 12: MODEL}  # the leader is probed by a generation
        prober = EndpointProber(HealthSettings(interval_s=0.5, timeout_s=30, failures=1))
        assert asyncio.run(prober.check(group.leader)) is False  # the whole pipeline answers its probe
        assert [i.status for i in group.leader.inventory()] == ["running"]

        trees = [*process_tree(leader.pid), *process_tree(follower.pid)]
        os.killpg(follower.pid, signal.SIGKILL)  # the follower's node dies
        wait_until(lambda: not pid_alive(follower.pid), timeout=30, what="follower gone")
        assert group.follower.inventory() == []  # its own agent reports the follower gone
        health = requests.get(f"{base}/health", timeout=30).status_code
        print(f"vLLM's own GET /health on the leader after the follower died: {health}")
        prober = EndpointProber(HealthSettings(interval_s=0.5, timeout_s=5, failures=2))

        def leader_failed() -> bool:
            asyncio.run(prober.check(group.leader))
            return [i.status for i in group.leader.inventory()] != ["running"]

        wait_until(leader_failed, timeout=300, interval=1, what="the leader fails its health check")
        statuses = [i.status for i in group.leader.inventory()]
        print(f"after the follower died the leader reports {statuses or 'no server (its process exited)'}")
        assert statuses in ([], ["unresponsive"])
    finally:
        group.stop()
    wait_until(lambda: not any(pid_alive(p.pid) for p in trees), timeout=60, what="no process of the group left")

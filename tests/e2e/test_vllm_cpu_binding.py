"""Real vLLM (CPU build, the tiny Llama) started by the agent's EndpointManager: two servers on one node
(an old replica and its rolling update's replacement) each bind their OpenMP threads to a core of their own
— vLLM's own log of its binding says which — instead of both binding core 0, and both answer."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from agent.protocol import EndpointStartPayload, ModelDownloadPayload
from agent.workloads.cpu_cores import node_cores
from agent.workloads.endpoints import EndpointManager
from agent.workloads.models import ModelCache
from tests.e2e.test_vllm_endpoint import engine_python, tiny_model  # noqa: F401 (fixtures)
from tests.support.hub_standin import HubStandin

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

MODEL = "acme/tiny-llama"


def quiet(*_args: object, **_kwargs: object) -> None:
    """A ProgressFn that ignores its calls."""


@pytest.fixture
def vllm_manager(engine_python, tiny_model, tmp_path, monkeypatch) -> Iterator[EndpointManager]:  # noqa: F811
    hub = HubStandin().start()
    hub.add_repo(MODEL, tiny_model)
    cache = ModelCache(tmp_path / "models", endpoint=hub.url)
    cache.download(ModelDownloadPayload(model_id=MODEL), quiet)
    monkeypatch.setenv("CLEVERTHIS_VLLM_CPU_PYTHON", engine_python)
    monkeypatch.setenv("CLEVERTHIS_VLLM_DEVICE", "cpu")
    monkeypatch.setenv("CLEVERTHIS_VLLM_MAX_MODEL_LEN", "128")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    manager = EndpointManager(cache, tmp_path / "endpoints", ready_timeout_s=900)
    yield manager
    manager.stop_all()
    hub.stop()


def bound_cores(log: Path) -> list[int]:
    """The cores vLLM says it bound its worker's OpenMP threads to ("local_rank=0, core ids=[...]")."""
    found = re.findall(r"local_rank=0, core ids=\[([0-9, ]*)\]", log.read_text(errors="replace"))
    assert found, log.read_text(errors="replace")[-3000:]
    return [int(c) for c in found[-1].split(",") if c.strip()]


def test_two_real_vllm_servers_bind_distinct_cores(vllm_manager):
    assert len(node_cores()) >= 2, "this test needs a node with two cores"
    old = vllm_manager.start(EndpointStartPayload(endpoint_id="vllmold00001", model_id=MODEL), quiet)
    new = vllm_manager.start(EndpointStartPayload(endpoint_id="vllmnew00001", model_id=MODEL), quiet)
    old_cores = bound_cores(vllm_manager.state_dir / "endpoint-vllmold00001.log")
    new_cores = bound_cores(vllm_manager.state_dir / "endpoint-vllmnew00001.log")
    assert len(old_cores) == len(new_cores) == 1
    assert set(old_cores).isdisjoint(new_cores)
    for result in (old, new):
        reply = requests.post(
            f"http://127.0.0.1:{result.port}/v1/completions",
            json={"model": MODEL, "prompt": "the fleet", "max_tokens": 4, "ignore_eos": True},
            timeout=300,
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 4

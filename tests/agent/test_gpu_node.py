"""The agent on a machine with real NVIDIA GPUs: NVML detection, heartbeats and an endpoint placed on a GPU.

Skipped where NVML finds no GPU (every CI machine here). On a GPU machine: `detect_gpus` reads every card
through nvidia-ml-py, heartbeats carry their memory, and `EndpointManager` starts a server on the GPU it
chose — `tests.support.gpu_standin` holds real memory on CUDA device 0 of its `CUDA_VISIBLE_DEVICES`, and
NVML must see that memory on exactly the card the agent named. A request the cards cannot hold is refused
before anything starts. Needs PyTorch with CUDA for the server; no model weights, no network.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import inventory
from agent.errors import CommandFailed
from agent.protocol import EndpointStartPayload, EndpointStopPayload, ModelDownloadPayload
from agent.workloads.endpoints import EndpointManager
from agent.workloads.models import ModelCache
from tests.support.hub_standin import HubStandin

GPUS = inventory.detect_gpus()
pytestmark = pytest.mark.skipif(not GPUS, reason="no NVIDIA GPU here (NVML found none)")
REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "acme/tiny-gpu"
HOLD_MIB = 2048


def quiet(*_: object, **__: object) -> None:
    """A progress callback that drops progress."""


@pytest.fixture
def models(tmp_path: Path) -> Iterator[ModelCache]:
    """A model cache holding MODEL, downloaded for real from the Hub stand-in."""
    hub = HubStandin().start()
    hub.add_repo(MODEL, {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"\0" * 4096})
    cache = ModelCache(tmp_path / "models", endpoint=hub.url)
    cache.download(ModelDownloadPayload(model_id=MODEL), quiet)
    yield cache
    hub.stop()


def test_nvml_reports_every_gpu_with_its_memory():
    for index, gpu in enumerate(GPUS):
        assert gpu.index == index
        assert gpu.name, gpu
        assert gpu.uuid.startswith("GPU-"), gpu
        assert gpu.memory_total_mb > 1024, gpu
        assert 0 <= gpu.memory_used_mb <= gpu.memory_total_mb, gpu
        assert 0.0 <= gpu.utilization_percent <= 100.0, gpu
    beat = inventory.heartbeat()
    assert [g.uuid for g in beat.gpus] == [g.uuid for g in GPUS]
    facts = inventory.host_facts()
    assert [(g.name, g.memory_total_mb) for g in facts.gpus] == [(g.name, g.memory_total_mb) for g in GPUS]


def test_an_endpoint_server_runs_on_the_gpu_the_agent_chose(models, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.chdir(REPO_ROOT)  # so `-m tests.support.gpu_standin` resolves
    monkeypatch.setenv("CTFLEET_STANDIN_HOLD_MIB", str(HOLD_MIB))
    server = [sys.executable, "-m", "tests.support.gpu_standin"]
    manager = EndpointManager(models, tmp_path / "state", server_command=server, gpus_fn=inventory.detect_gpus)
    before = {g.index: g.memory_used_mb for g in inventory.detect_gpus()}
    try:
        result = manager.start(EndpointStartPayload(endpoint_id="gpu1", model_id=MODEL, gpus=1), quiet)
        assert result.device == "gpu"
        environ = Path(f"/proc/{result.pid}/environ").read_bytes().split(b"\0")
        [visible] = [e.split(b"=", 1)[1] for e in environ if e.startswith(b"CUDA_VISIBLE_DEVICES=")]
        chosen = int(visible)
        deadline = time.monotonic() + 30
        while True:  # NVML's used memory follows the allocation within moments
            grown = {g.index: g.memory_used_mb - before[g.index] for g in inventory.detect_gpus()}
            if grown[chosen] >= HOLD_MIB * 0.9 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert grown[chosen] >= HOLD_MIB * 0.9, (chosen, grown, result.get("log_tail"))
        others = {i: mb for i, mb in grown.items() if i != chosen}
        assert all(mb < HOLD_MIB / 2 for mb in others.values()), others  # no other card took it
        print(f"GPU {chosen} ({GPUS[chosen].name}): +{grown[chosen]} MiB while the endpoint ran", file=sys.stderr)
    finally:
        manager.stop_all()
    after = {g.index: g.memory_used_mb - before[g.index] for g in inventory.detect_gpus()}
    assert after[chosen] < HOLD_MIB / 2, after  # stopping the endpoint gave the memory back


def test_an_endpoint_the_gpus_cannot_hold_is_refused_before_anything_starts(models, tmp_path):
    manager = EndpointManager(models, tmp_path / "state", server_command=["false"], gpus_fn=inventory.detect_gpus)
    too_much = max(g.memory_total_mb for g in GPUS) + 1
    with pytest.raises(CommandFailed) as refused:
        manager.start(EndpointStartPayload(endpoint_id="gpu2", model_id=MODEL, gpus=1, min_vram_mb=too_much), quiet)
    assert refused.value.code == "insufficient_vram"
    assert f"needs {too_much} MB" in refused.value.message
    with pytest.raises(CommandFailed):
        manager.stop(EndpointStopPayload(endpoint_id="gpu2"))  # nothing was started under that id

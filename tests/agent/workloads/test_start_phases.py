"""The phases of an endpoint server's start and the agent's side of LoRA adapters, with real processes: the OpenAI
stand-in replaces vLLM and the Hub stand-in serves the weights (vLLM's own adapter API is exercised for real in
tests/e2e/test_vllm_lora_cold_start.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import CommandFailed
from agent.protocol import (
    EndpointAdapterLoadPayload,
    EndpointStartPayload,
    LoraAdapterRef,
    ModelDownloadPayload,
    parse_payload,
)
from agent.protocol.versions import ProtocolError
from agent.workloads.adapters import adapter_path, lora_enabled
from agent.workloads.endpoints import EndpointManager, server_argv
from agent.workloads.engine import Engine
from agent.workloads.models import ModelCache
from agent.workloads.server_process import port_in_use
from agent.workloads.start_phases import PhaseClock
from tests.support.hub_standin import HubStandin
from tests.support.processes import REPO_ROOT

STANDIN = [sys.executable, "-m", "tests.support.openai_standin"]
MODEL = "acme/tiny-chat"
FILES = {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"\0" * 4096}


def quiet(*_args: object, **_kwargs: object) -> None:
    """A ProgressFn that ignores its calls."""


@pytest.fixture
def hub() -> Iterator[HubStandin]:
    standin = HubStandin().start()
    standin.add_repo(MODEL, FILES)
    yield standin
    standin.stop()


@pytest.fixture
def manager(hub: HubStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EndpointManager]:
    monkeypatch.chdir(REPO_ROOT)  # so `-m tests.support.openai_standin` resolves
    cache = ModelCache(tmp_path / "models", endpoint=hub.url)
    manager = EndpointManager(cache, tmp_path / "state", server_command=STANDIN, ready_timeout_s=30)
    yield manager
    manager.stop_all()


def test_a_warm_start_reports_its_phases_in_order(manager):
    manager.models.download(ModelDownloadPayload(model_id=MODEL), quiet)
    result = manager.start(EndpointStartPayload(endpoint_id="a1", model_id=MODEL), quiet)
    phases = result.phases
    assert (phases.weights, phases.weights_bytes) == ("present", 4096)  # the weight files, not the config
    assert 0 <= phases.weights_s <= phases.server_started_s <= phases.model_loaded_s <= phases.healthy_s
    assert phases.healthy_s > phases.server_started_s  # the stand-in takes a moment to answer
    assert phases.model_loaded_s == phases.healthy_s  # the stand-in never logs its weights loaded
    assert phases.adapters_s is None
    assert result.adapters is None
    again = manager.start(EndpointStartPayload(endpoint_id="a1", model_id=MODEL), quiet)
    assert again.phases is None  # a server already running took no start


def test_a_cold_start_downloads_the_weights_first_when_asked(manager, hub):
    with pytest.raises(CommandFailed) as refused:
        manager.start(EndpointStartPayload(endpoint_id="c1", model_id=MODEL), quiet)
    assert refused.value.code == "weights_missing"
    result = manager.start(EndpointStartPayload(endpoint_id="c1", model_id=MODEL, download=True), quiet)
    phases = result.phases
    assert phases.weights == "downloaded"
    assert phases.weights_bytes == sum(len(b) for b in FILES.values())  # the whole snapshot fetched
    assert 0 < phases.weights_s <= phases.server_started_s < phases.healthy_s
    assert manager.models.path_for(MODEL) is not None


def test_the_model_loaded_line_of_the_log_marks_its_phase(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(b"INFO starting\n")
    clock = PhaseClock()
    clock.watch_log(log)
    clock.poll_log()
    assert "model_loaded" not in clock.marks
    with log.open("ab") as fh:
        fh.write(b"INFO [default_loader.py:262] Loading weights took 0.01 seconds\n")
    clock.poll_log()
    loaded = clock.marks["model_loaded"]
    clock.mark("healthy")
    assert clock.result().model_loaded_s == loaded <= clock.result().healthy_s


def test_adapters_turn_lora_on_and_a_server_that_cannot_load_them_is_ended(manager, tmp_path):
    manager.models.download(ModelDownloadPayload(model_id=MODEL), quiet)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    payload = EndpointStartPayload(
        endpoint_id="l1", model_id=MODEL, adapters=[LoraAdapterRef(name="tone", path=str(adapter))]
    )
    argv = server_argv(Engine(STANDIN, "cpu"), Path("/m"), 8000, payload)
    assert argv.count("--enable-lora") == 1
    assert lora_enabled(argv)
    assert not lora_enabled([*argv, "--no-enable-lora"])
    # the stand-in has no /v1/load_lora_adapter: the start fails and leaves no server behind
    notes: list[str] = []
    with pytest.raises(CommandFailed) as failed:
        manager.start(payload, lambda message, **_: notes.append(message))
    assert failed.value.code == "adapter_failed"
    assert manager.inventory() == []
    port = int(next(n for n in notes if n.startswith("starting endpoint l1")).rsplit(" ", 1)[1])
    assert "adapter tone loaded" not in notes
    assert not port_in_use(port)  # the server that answered was ended


def test_adapter_loads_need_a_running_server_with_lora_on(manager, tmp_path):
    manager.models.download(ModelDownloadPayload(model_id=MODEL), quiet)
    manager.start(EndpointStartPayload(endpoint_id="n1", model_id=MODEL), quiet)
    load = EndpointAdapterLoadPayload(endpoint_id="n1", adapter=LoraAdapterRef(name="tone", path=str(tmp_path)))
    with pytest.raises(CommandFailed) as off:
        manager.execute("endpoint.adapter.load", load, progress=quiet)
    assert off.value.code == "lora_disabled"
    missing = EndpointAdapterLoadPayload(endpoint_id="zz", adapter=load.adapter)
    with pytest.raises(CommandFailed) as gone:
        manager.execute("endpoint.adapter.load", missing, progress=quiet)
    assert gone.value.code == "not_found"
    with pytest.raises(CommandFailed) as empty:
        adapter_path(manager.models, LoraAdapterRef(name="tone", path=str(tmp_path)), quiet)
    assert empty.value.code == "adapter_missing"  # a folder without adapter_config.json


@pytest.mark.parametrize(
    "adapter",
    [
        {"name": "tone", "path": "relative/dir"},
        {"name": "tone", "path": "/srv/../etc"},
        {"name": "bad name", "model_id": "acme/x"},
        {"name": "tone", "model_id": "not a repo"},
    ],
)
def test_the_protocol_refuses_bad_adapter_references(adapter):
    with pytest.raises(ProtocolError):
        parse_payload("endpoint.adapter.load", {"endpoint_id": "0123456789ab", "adapter": adapter})

"""EndpointManager with real processes: an OpenAI-compatible stand-in server replaces vLLM (needs CUDA)."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from agent import protocol
from agent.errors import CommandFailed
from agent.protocol import EndpointStartPayload, EndpointStopPayload, EndpointStopResult, GpuInfo, ModelDownloadPayload
from agent.workloads.endpoints import VLLM_COMMAND, EndpointManager
from agent.workloads.engine import choose_engine
from agent.workloads.models import ModelCache
from agent.workloads.server_process import pid_alive as _pid_alive
from tests.support.hub_standin import HubStandin
from tests.support.processes import REPO_ROOT, wait_until

STANDIN = [sys.executable, "-m", "tests.support.openai_standin"]
MODEL = "acme/tiny-chat"


def quiet(*_args: object, **_kwargs: object) -> None:
    """A ProgressFn that ignores its calls."""


@pytest.fixture(scope="module")
def cached_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModelCache]:
    """A model cache holding MODEL, downloaded for real from the Hub stand-in."""
    hub = HubStandin().start()
    hub.add_repo(MODEL, {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"\0" * 1024})
    cache = ModelCache(tmp_path_factory.mktemp("models"), endpoint=hub.url)
    cache.download(ModelDownloadPayload(model_id=MODEL), quiet)
    yield cache
    hub.stop()


@pytest.fixture
def manager(cached_models: ModelCache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EndpointManager]:
    monkeypatch.chdir(REPO_ROOT)  # so `-m tests.support.openai_standin` resolves
    manager = EndpointManager(cached_models, tmp_path / "state", server_command=STANDIN, ready_timeout_s=30)
    yield manager
    manager.stop_all()


def test_start_serves_the_cached_model_and_stop_ends_it(manager, cached_models):
    result = manager.start(EndpointStartPayload(endpoint_id="ep1", model_id=MODEL), quiet)
    base = f"http://127.0.0.1:{result.port}"

    models = requests.get(f"{base}/v1/models", timeout=5).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    reply = requests.post(
        f"{base}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi there"}]},
        timeout=5,
    ).json()
    assert reply["choices"][0]["message"]["content"] == "echo: hi there"
    with requests.post(
        f"{base}/v1/chat/completions",
        json={"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "a b c"}]},
        stream=True,
        timeout=5,
    ) as stream:
        events = [line.removeprefix(b"data: ") for line in stream.iter_lines() if line]
    assert events[-1] == b"[DONE]"
    assert "".join(json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]) == "echo: a b c"

    cmdline = Path(f"/proc/{result.pid}/cmdline").read_bytes().split(b"\0")
    assert str(cached_models.path_for(MODEL)).encode() in cmdline
    [info] = manager.inventory()
    assert (info.endpoint_id, info.model_id, info.port, info.pid, info.status) == (
        "ep1",
        MODEL,
        result.port,
        result.pid,
        "running",
    )

    assert manager.stop(EndpointStopPayload(endpoint_id="ep1")).status == "stopped"
    assert not _pid_alive(result.pid)
    assert manager.inventory() == []
    assert manager.stop(EndpointStopPayload(endpoint_id="ep1")).status == "stopped"


def test_start_again_returns_the_running_endpoint(manager):
    first = manager.start(EndpointStartPayload(endpoint_id="ep2", model_id=MODEL), quiet)
    again = manager.start(EndpointStartPayload(endpoint_id="ep2", model_id=MODEL), quiet)
    assert "openai-standin serving" in first.log_tail
    assert again == dataclasses.replace(first, log_tail=None, phases=None)  # a running server took no start
    assert len(manager.inventory()) == 1


def test_a_restarted_manager_still_knows_and_stops_its_endpoints(manager, cached_models, tmp_path):
    result = manager.start(EndpointStartPayload(endpoint_id="ep3", model_id=MODEL), quiet)
    restarted = EndpointManager(cached_models, tmp_path / "state", server_command=STANDIN)
    assert [e.endpoint_id for e in restarted.inventory()] == ["ep3"]
    restarted.stop(EndpointStopPayload(endpoint_id="ep3"))
    wait_until(lambda: not _pid_alive(result.pid), timeout=10, what="endpoint process to exit")
    assert manager.inventory() == []


def test_model_not_downloaded_is_weights_missing(manager):
    with pytest.raises(CommandFailed) as err:
        manager.start(EndpointStartPayload(endpoint_id="ep4", model_id="acme/other"), quiet)
    assert err.value.code == "weights_missing"
    assert manager.inventory() == []


def gpu(index: int, total: int, used: int) -> GpuInfo:
    return GpuInfo(index=index, name="NVIDIA H100", memory_total_mb=total, memory_used_mb=used)


@pytest.mark.parametrize(
    ("gpus", "request_gpus", "min_vram_mb"),
    [
        ([], 1, 0),
        ([gpu(0, 80_000, 0)], 2, 0),
        ([gpu(0, 80_000, 70_000)], 1, 20_000),
        ([gpu(0, 24_000, 0), gpu(1, 24_000, 20_000)], 2, 40_000),
        ([], 0, 1),
    ],
)
def test_not_enough_gpu_is_insufficient_vram(cached_models, tmp_path, gpus, request_gpus, min_vram_mb):
    manager = EndpointManager(cached_models, tmp_path, server_command=STANDIN, gpus_fn=lambda: gpus)
    payload = EndpointStartPayload(endpoint_id="ep5", model_id=MODEL, gpus=request_gpus, min_vram_mb=min_vram_mb)
    with pytest.raises(CommandFailed) as err:
        manager.start(payload, quiet)
    assert err.value.code == "insufficient_vram"


def test_gpus_with_most_free_memory_are_given_to_the_server(cached_models, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    gpus = [gpu(0, 80_000, 79_000), gpu(1, 80_000, 1_000), gpu(2, 80_000, 0)]
    manager = EndpointManager(cached_models, tmp_path, server_command=STANDIN, gpus_fn=lambda: gpus)
    try:
        result = manager.start(
            EndpointStartPayload(endpoint_id="ep6", model_id=MODEL, gpus=2, min_vram_mb=100_000), quiet
        )
        environ = Path(f"/proc/{result.pid}/environ").read_bytes().split(b"\0")
        assert b"CUDA_VISIBLE_DEVICES=2,1" in environ
        assert b"CUDA_DEVICE_ORDER=PCI_BUS_ID" in environ  # NVML's indices name the same cards for CUDA
        cmdline = Path(f"/proc/{result.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[cmdline.index(b"--tensor-parallel-size") + 1] == b"2"
    finally:
        manager.stop_all()


def test_on_a_gpu_node_the_agent_pins_what_the_quota_counts(cached_models, tmp_path, monkeypatch):
    """An endpoint asking no GPU still gets one on a GPU node: the rule both sides read from the protocol."""
    monkeypatch.chdir(REPO_ROOT)
    gpus = [gpu(0, 24_000, 20_000), gpu(1, 48_000, 0)]
    manager = EndpointManager(cached_models, tmp_path, server_command=STANDIN, gpus_fn=lambda: gpus)
    try:
        result = manager.start(EndpointStartPayload(endpoint_id="ep-g0", model_id=MODEL), quiet)
        environ = Path(f"/proc/{result.pid}/environ").read_bytes().split(b"\0")
        [visible] = [e.split(b"=", 1)[1].decode() for e in environ if e.startswith(b"CUDA_VISIBLE_DEVICES=")]
        pinned = [int(i) for i in visible.split(",")]
        assert len(pinned) == protocol.endpoint_gpus_held(gpus=0, min_vram_mb=0, node_gpus=len(gpus)) == 1
        assert [g.index for g in protocol.select_gpus(gpus, 1)] == pinned == [1]  # the one with most free memory
        held = protocol.endpoint_vram_held_mb(gpus=0, min_vram_mb=0, node_gpus=gpus)
        assert held == 43_200  # what the quota counts: vLLM's 0.9 of the pinned 48,000 MB card
    finally:
        manager.stop_all()


def test_server_that_dies_reports_its_log_tail(cached_models, tmp_path):
    crash = [sys.executable, "-c", "import sys; print('RuntimeError: CUDA out of memory', flush=True); sys.exit(3)"]
    manager = EndpointManager(cached_models, tmp_path, server_command=crash)
    with pytest.raises(CommandFailed) as err:
        manager.start(EndpointStartPayload(endpoint_id="ep7", model_id=MODEL), quiet)
    assert "status 3" in err.value.message
    assert "CUDA out of memory" in err.value.data["log_tail"]
    assert manager.inventory() == []


def test_server_that_never_answers_times_out_and_is_killed(cached_models, tmp_path):
    # the server writes its pid down before it hangs (on a loaded machine its first output may come after
    # the ready timeout, so the pid is not taken from its log)
    pid_file = tmp_path / "hang.pid"
    hang = [
        sys.executable,
        "-c",
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); print('loading', flush=True); "
        "time.sleep(60)",
    ]
    manager = EndpointManager(cached_models, tmp_path, server_command=hang, ready_timeout_s=3, stop_timeout_s=2)
    with pytest.raises(CommandFailed) as err:
        manager.start(EndpointStartPayload(endpoint_id="ep8", model_id=MODEL), quiet)
    assert "did not answer" in err.value.message
    if pid_file.exists():  # it got as far as writing it: that process must be gone
        assert not _pid_alive(int(pid_file.read_text()))
    assert manager.inventory() == []


def test_default_command_is_vllm_unless_configured(monkeypatch):
    monkeypatch.delenv("CLEVERTHIS_ENDPOINT_SERVER", raising=False)
    assert choose_engine([]).program == VLLM_COMMAND
    assert VLLM_COMMAND[1:] == ["-m", "vllm.entrypoints.openai.api_server"]
    monkeypatch.setenv("CLEVERTHIS_ENDPOINT_SERVER", "/opt/py/bin/python -m my.server")
    assert choose_engine([]).program == ["/opt/py/bin/python", "-m", "my.server"]


def test_an_endpoint_still_loading_is_reported_as_starting(cached_models, tmp_path):
    hang = [sys.executable, "-c", "import time; time.sleep(60)"]
    manager = EndpointManager(cached_models, tmp_path, server_command=hang, ready_timeout_s=1, stop_timeout_s=2)
    seen: list[list[str]] = []

    def progress(message: str, *_args: object, **_kwargs: object) -> None:
        if message.startswith("waiting for endpoint"):
            seen.append([e.status for e in manager.inventory()])

    with pytest.raises(CommandFailed):
        manager.start(EndpointStartPayload(endpoint_id="ep9", model_id=MODEL), progress)
    assert seen[0] == ["starting"]
    assert manager.inventory() == []


def test_a_ready_endpoint_is_reported_as_running(manager):
    manager.start(EndpointStartPayload(endpoint_id="ep10", model_id=MODEL), quiet)
    assert [e.status for e in manager.inventory()] == ["running"]


def test_stop_ends_the_whole_process_tree(manager):
    """A server's helper processes (vLLM's engine core) end with it, even one in a session of its own."""
    manager.server_command = [*STANDIN, "--engine-child"]  # the node's own server command, not an endpoint's flag
    result = manager.start(EndpointStartPayload(endpoint_id="tree", model_id=MODEL), quiet)
    log = Path(manager.state_dir / "endpoint-tree.log")
    wait_until(lambda: "engine child pid" in log.read_text(), timeout=10, what="engine child")
    child_pid = int(log.read_text().split("engine child pid ")[1].split()[0])
    assert _pid_alive(child_pid)
    manager.stop(EndpointStopPayload(endpoint_id="tree"))
    assert not _pid_alive(result.pid)
    wait_until(lambda: not _pid_alive(child_pid), timeout=10, what="engine child to end")


def test_cpu_node_runs_the_cpu_build_with_its_flags(cached_models, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    manager = EndpointManager(cached_models, tmp_path, server_command=STANDIN, gpus_fn=lambda: [])
    try:
        result = manager.start(EndpointStartPayload(endpoint_id="cpu", model_id=MODEL), quiet)
        assert result.device == "cpu"
        cmdline = Path(f"/proc/{result.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[cmdline.index(b"--dtype") + 1] == b"float32"
        assert b"--enforce-eager" in cmdline
        environ = Path(f"/proc/{result.pid}/environ").read_bytes().split(b"\0")
        assert b"HF_HUB_OFFLINE=1" in environ
        assert b"VLLM_CPU_KVCACHE_SPACE=1" in environ
        assert not any(e.startswith(b"CUDA_VISIBLE_DEVICES=") for e in environ)
    finally:
        manager.stop_all()


def test_model_too_large_for_memory_fails_at_once(cached_models, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "100000")  # a KV cache of ~100 TB cannot fit anywhere
    manager = EndpointManager(cached_models, tmp_path, server_command=STANDIN, gpus_fn=lambda: [])
    with pytest.raises(CommandFailed) as err:
        manager.start(EndpointStartPayload(endpoint_id="big", model_id=MODEL), quiet)
    assert err.value.code == "insufficient_memory"
    assert err.value.message.startswith("insufficient memory: ")
    assert manager.inventory() == []


def test_weights_larger_than_free_vram_fail_at_once(tmp_path, monkeypatch):
    """On a GPU node the weights alone must fit the chosen GPU's free memory (a sparse 3 GB file here)."""
    hub = HubStandin().start()
    try:
        hub.add_repo("acme/big", {"config.json": b"{}", "model.safetensors": b"\0" * 16})
        cache = ModelCache(tmp_path / "models", endpoint=hub.url)
        cache.download(ModelDownloadPayload(model_id="acme/big"), quiet)
    finally:
        hub.stop()
    weights = cache.path_for("acme/big") / "model.safetensors"
    with weights.resolve().open("r+b") as fh:
        fh.truncate(3 * 1024**3)
    manager = EndpointManager(cache, tmp_path / "state", server_command=STANDIN, gpus_fn=lambda: [gpu(0, 4_000, 2_000)])
    with pytest.raises(CommandFailed) as err:
        manager.start(EndpointStartPayload(endpoint_id="big", model_id="acme/big"), quiet)
    assert err.value.code == "insufficient_vram"
    assert err.value.message.startswith("insufficient GPU VRAM: ")
    assert err.value.data == {"min_vram_mb": 3072, "free_vram_mb": 2000}


def test_engine_follows_the_node_and_the_settings():
    gpus = [gpu(0, 80_000, 0)]
    assert choose_engine([], {}).device == "cpu"
    assert choose_engine(gpus, {}).device == "gpu"
    assert choose_engine([], {}).program == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    environ = {"CLEVERTHIS_VLLM_CPU_PYTHON": "/opt/vllm-cpu/bin/python", "CLEVERTHIS_VLLM_GPU_PYTHON": "/opt/g/python"}
    assert choose_engine([], environ).program[0] == "/opt/vllm-cpu/bin/python"
    assert choose_engine(gpus, environ).program[0] == "/opt/g/python"
    forced = choose_engine(gpus, environ | {"CLEVERTHIS_VLLM_DEVICE": "cpu"})
    assert (forced.device, forced.program[0]) == ("cpu", "/opt/vllm-cpu/bin/python")
    assert "--enforce-eager" in forced.args()
    assert "--enforce-eager" not in choose_engine(gpus, environ).args()


def test_stopping_an_endpoint_this_node_never_ran_fails_with_a_reason(manager):
    with pytest.raises(CommandFailed) as failed:
        manager.stop(EndpointStopPayload(endpoint_id="never-started"))
    assert failed.value.code == "not_found"
    assert "never-started" in failed.value.message


def test_a_stopped_endpoint_stays_out_of_the_inventory_and_stops_again(manager, cached_models, tmp_path):
    result = manager.start(EndpointStartPayload(endpoint_id="ep-tomb", model_id=MODEL), quiet)
    manager.stop(EndpointStopPayload(endpoint_id="ep-tomb"))
    restarted = EndpointManager(cached_models, tmp_path / "state", server_command=STANDIN)
    assert restarted.inventory() == []
    assert restarted.stop(EndpointStopPayload(endpoint_id="ep-tomb")) == EndpointStopResult(
        endpoint_id="ep-tomb", status="stopped", pid=result.pid
    )


def test_extra_args_setting_a_flag_the_agent_sets_are_refused(manager):
    """A control plane that let one through still gets no server listening where the agent did not ask."""
    payload = EndpointStartPayload(endpoint_id="ep11", model_id=MODEL, extra_args=["--port=1"])
    with pytest.raises(CommandFailed) as exc:
        manager.start(payload, quiet)
    assert exc.value.code == "invalid_payload"
    assert "--port" in str(exc.value)
    assert manager.inventory() == []


@pytest.mark.parametrize(
    ("extra_args", "said"),
    [
        (["--trust-remote-code"], "--trust-remote-code is refused"),
        (["--chat-template", "/etc/hostname"], "never a file name"),
        (["--allowed-local-media-path", "/"], "--allowed-local-media-path is refused"),
        (["--tool-parser-plugin", "/tmp/plugin.py"], "--tool-parser-plugin is refused"),
        (["--made-up-flag"], "--made-up-flag is not a server flag an endpoint may set"),
    ],
)
def test_the_agent_refuses_server_args_outside_the_allow_list(manager, extra_args, said):
    """A control plane that let one through (or an older one) still starts no server with it on this host."""
    payload = EndpointStartPayload(endpoint_id="ep-deny", model_id=MODEL, extra_args=extra_args)
    with pytest.raises(CommandFailed) as exc:
        manager.start(payload, quiet)
    assert exc.value.code == "invalid_payload"
    assert said in str(exc.value)
    assert manager.inventory() == []


def test_the_agent_refuses_a_template_naming_a_file_in_its_working_directory(manager):
    """vLLM opens a --chat-template value as a file first: one that names a file there never reaches it."""
    name = "{{ x }}.jinja"
    Path(name).write_text("{{ secret }}")  # the fixture's working directory is the repository root
    try:
        payload = EndpointStartPayload(endpoint_id="ep-file", model_id=MODEL, extra_args=["--chat-template", name])
        with pytest.raises(CommandFailed) as exc:
            manager.start(payload, quiet)
        assert "names a file on this node" in str(exc.value)
    finally:
        Path(name).unlink()


def test_extra_args_come_after_the_engine_defaults_and_win(manager, monkeypatch):
    """An endpoint's `--max-model-len` overrides the node's CLEVERTHIS_VLLM_MAX_MODEL_LEN (a later flag wins),
    as the server's model list shows."""
    monkeypatch.setenv("CLEVERTHIS_VLLM_MAX_MODEL_LEN", "256")
    default = manager.start(EndpointStartPayload(endpoint_id="ep12", model_id=MODEL), quiet)
    own = manager.start(
        EndpointStartPayload(endpoint_id="ep13", model_id=MODEL, extra_args=["--max-model-len", "64"]), quiet
    )
    lengths = [
        requests.get(f"http://127.0.0.1:{r.port}/v1/models", timeout=10).json()["data"][0]["max_model_len"]
        for r in (default, own)
    ]
    assert lengths == [256, 64]

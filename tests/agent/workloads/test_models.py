"""ModelCache against a loopback Hub stand-in speaking the file API that huggingface_hub uses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import CommandFailed
from agent.protocol import ModelDownloadPayload
from agent.workloads.models import ModelCache
from tests.support.hub_standin import HubStandin
from tests.support.processes import free_port

WEIGHTS = bytes(range(256)) * 4096  # 1 MiB
FILES = {"config.json": b'{"model_type": "tiny"}', "model.safetensors": WEIGHTS, "tokenizer/vocab.txt": b"a\nb\n"}


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float | None, dict]] = []

    def __call__(self, message: str, percent: float | None = None, data: dict | None = None) -> None:
        self.calls.append((message, percent, data or {}))


@pytest.fixture
def hub() -> Iterator[HubStandin]:
    standin = HubStandin().start()
    yield standin
    standin.stop()


@pytest.fixture
def cache(tmp_path: Path, hub: HubStandin) -> ModelCache:
    return ModelCache(tmp_path / "models", endpoint=hub.url)


def test_download_snapshots_every_file_and_reports_progress(cache, hub):
    sha = hub.add_repo("acme/tiny", FILES)
    progress = Recorder()

    result = cache.download(ModelDownloadPayload(model_id="acme/tiny"), progress)

    path = Path(result.path)
    assert result.commit == sha
    assert path.name == sha
    assert (path / "model.safetensors").read_bytes() == WEIGHTS
    assert (path / "tokenizer" / "vocab.txt").read_bytes() == b"a\nb\n"
    assert result.files == 3
    assert result.size_bytes == sum(len(v) for v in FILES.values())
    _, last_percent, last_data = progress.calls[-1]
    assert last_percent == 100.0
    assert last_data["files"] == 3
    assert any(data.get("bytes_total") for _, _, data in progress.calls[:-1]), progress.calls

    assert cache.path_for("acme/tiny") is not None
    assert cache.path_for("acme/tiny", sha) is not None
    assert cache.path_for("acme/tiny") == path
    assert cache.path_for("acme/tiny", "other-branch") is None
    [entry] = cache.inventory()
    assert (entry.model_id, entry.revision, entry.path) == ("acme/tiny", "main", str(path))
    assert entry.size_bytes == result.size_bytes


def test_allow_patterns_limit_the_files(cache, hub):
    hub.add_repo("acme/tiny", FILES)
    result = cache.download(ModelDownloadPayload(model_id="acme/tiny", allow_patterns=["*.json"]), Recorder())
    assert sorted(p.name for p in Path(result.path).rglob("*") if p.is_file()) == ["config.json"]


def test_interrupted_download_resumes_with_a_range_request(cache, hub):
    # huggingface_hub writes in DOWNLOAD_CHUNK_SIZE (10 MiB) pieces: a resume starts after the last whole one.
    big = bytes(range(256)) * (12 * 4096)  # 12 MiB
    hub.add_repo("acme/big", {"config.json": b"{}", "model.safetensors": big})
    hub.drop_after("acme/big", "model.safetensors", 11 * 1024 * 1024)

    result = cache.download(ModelDownloadPayload(model_id="acme/big"), Recorder())

    assert (Path(result.path) / "model.safetensors").read_bytes() == big
    gets = hub.gets_of("model.safetensors")
    assert len(gets) == 2
    assert "range" not in gets[0].headers
    resumed_from = int(gets[1].headers["range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < resumed_from <= 11 * 1024 * 1024


def test_second_download_fetches_nothing_again(cache, hub):
    hub.add_repo("acme/tiny", FILES)
    cache.download(ModelDownloadPayload(model_id="acme/tiny"), Recorder())
    before = len(hub.gets_of("model.safetensors"))
    cache.download(ModelDownloadPayload(model_id="acme/tiny"), Recorder())
    assert len(hub.gets_of("model.safetensors")) == before


def test_unknown_repo_is_model_not_found(cache, hub):
    with pytest.raises(CommandFailed) as err:
        cache.download(ModelDownloadPayload(model_id="acme/missing"), Recorder())
    assert err.value.code == "model_not_found"
    assert cache.path_for("acme/missing") is None


def test_unknown_revision_is_model_not_found(cache, hub):
    hub.add_repo("acme/tiny", FILES)
    with pytest.raises(CommandFailed) as err:
        cache.download(ModelDownloadPayload(model_id="acme/tiny", revision="v9"), Recorder())
    assert err.value.code == "model_not_found"


@pytest.mark.parametrize("model_id", ["", "a/b/c", "../etc", "org/na me", "org/-x", "org//x"])
def test_malformed_model_id_is_invalid_payload(cache, model_id):
    with pytest.raises(CommandFailed) as err:
        cache.download(ModelDownloadPayload(model_id=model_id), Recorder())
    assert err.value.code == "invalid_payload"


def test_unreachable_hub_is_hub_unreachable(tmp_path):
    cache = ModelCache(tmp_path / "models", endpoint=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(CommandFailed) as err:
        cache.download(ModelDownloadPayload(model_id="acme/tiny"), Recorder())
    assert err.value.code == "hub_unreachable"


def test_hf_endpoint_environment_variable_is_respected(tmp_path, hub, monkeypatch):
    hub.add_repo("acme/tiny", FILES)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    cache = ModelCache(tmp_path / "models")
    assert cache.download(ModelDownloadPayload(model_id="acme/tiny"), Recorder()).files == 3

"""The model cache managed by the agent: last use, eviction on request (refused while in use), a budget enforced
least-recently-used first after each download, and the figures its inventory reports (against the loopback Hub)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import CommandFailed
from agent.protocol import Inventory, InventoryReport, ModelDownloadPayload, ModelEvictPayload, decode, encode
from agent.workloads.models import ModelCache
from tests.support.hub_standin import HubStandin

MIB = 1024 * 1024


def _quiet(*_args, **_kwargs) -> None:
    return None


@pytest.fixture
def hub() -> Iterator[HubStandin]:
    standin = HubStandin().start()
    for name in ("acme/a", "acme/b", "acme/c"):
        standin.add_repo(name, {"config.json": b"{}", "model.safetensors": name.encode() * (MIB // 6)})
    yield standin
    standin.stop()


@pytest.fixture
def cache(tmp_path: Path, hub: HubStandin) -> ModelCache:
    return ModelCache(tmp_path / "models", endpoint=hub.url)


def _cached(cache: ModelCache) -> list[str]:
    return [m.model_id for m in cache.inventory()]


def test_download_reports_its_rate_and_stamps_last_use(cache):
    calls = []
    before = time.time()
    cache.download(ModelDownloadPayload(model_id="acme/a"), lambda m, percent=None, data=None: calls.append(data))
    rates = [d["bytes_per_s"] for d in calls if d and "bytes_per_s" in d]
    assert rates, calls
    assert rates[-1] > 0, calls
    (entry,) = cache.inventory()
    assert entry.last_used_at >= before
    assert cache.disk_free_bytes() > 0


def test_touch_makes_a_snapshot_the_most_recently_used(cache):
    for name in ("acme/a", "acme/b"):
        cache.download(ModelDownloadPayload(model_id=name), _quiet)
    first = {m.model_id: m.last_used_at for m in cache.inventory()}
    cache.touch("acme/a", "main")
    after = {m.model_id: m.last_used_at for m in cache.inventory()}
    assert after["acme/a"] > first["acme/b"]
    assert after["acme/b"] == first["acme/b"]


def test_evict_removes_the_snapshot_and_its_files(cache):
    result = cache.download(ModelDownloadPayload(model_id="acme/a"), _quiet)
    evicted = cache.evict(ModelEvictPayload(model_id="acme/a"))
    assert evicted.evicted
    assert evicted.freed_bytes == result.size_bytes
    assert _cached(cache) == []
    assert cache.path_for("acme/a") is None
    assert not Path(result.path).exists()
    again = cache.evict(ModelEvictPayload(model_id="acme/a"))
    assert not again.evicted
    assert again.freed_bytes == 0


def test_evict_is_refused_while_an_endpoint_serves_from_it(cache):
    cache.download(ModelDownloadPayload(model_id="acme/a"), _quiet)
    cache.in_use = lambda: {("acme/a", "main")}
    with pytest.raises(CommandFailed) as refused:
        cache.evict(ModelEvictPayload(model_id="acme/a"))
    assert refused.value.code == "conflict"
    assert "in use" in refused.value.message
    assert _cached(cache) == ["acme/a"]


def test_budget_evicts_least_recently_used_first_and_spares_what_is_in_use(cache):
    sizes = {}
    for name in ("acme/a", "acme/b"):
        sizes[name] = cache.download(ModelDownloadPayload(model_id=name), _quiet).size_bytes
    cache.touch("acme/a", "main")  # b is now the least recently used
    budget = sizes["acme/a"] + sizes["acme/b"]  # room for two of the three
    result = cache.download(ModelDownloadPayload(model_id="acme/c", cache_budget_bytes=budget), _quiet)
    assert result.evicted == ["acme/b@main"]
    assert _cached(cache) == ["acme/a", "acme/c"]
    assert cache.budget_bytes == budget
    assert ModelCache(cache.root).budget_bytes == budget  # kept across agent restarts

    # in use: spared even when it is the oldest; the budget is then exceeded rather than break a server
    cache.in_use = lambda: {("acme/a", "main"), ("acme/c", "main")}
    result = cache.download(ModelDownloadPayload(model_id="acme/b", cache_budget_bytes=sizes["acme/b"]), _quiet)
    assert result.evicted is None
    assert _cached(cache) == ["acme/a", "acme/b", "acme/c"]

    # no budget from the control plane: nothing is evicted, the file is gone
    cache.in_use = set
    cache.download(ModelDownloadPayload(model_id="acme/b"), _quiet)
    assert cache.budget_bytes == 0
    assert _cached(cache) == ["acme/a", "acme/b", "acme/c"]


def test_the_inventory_carries_the_cache_figures_over_the_wire(cache):
    cache.download(ModelDownloadPayload(model_id="acme/a"), _quiet)
    inventory = Inventory(models=cache.inventory(), disk_free_bytes=cache.disk_free_bytes(), cache_budget_bytes=5)
    frame = decode(encode(InventoryReport(inventory=inventory)))
    assert frame.inventory.disk_free_bytes == inventory.disk_free_bytes > 0
    assert frame.inventory.cache_budget_bytes == 5
    assert frame.inventory.models[0].last_used_at == inventory.models[0].last_used_at > 0
    old = decode(encode(InventoryReport(inventory=inventory, v=6)))  # an agent a version older
    assert old.inventory.disk_free_bytes == 0
    assert old.inventory.models[0].last_used_at == 0.0


def test_a_local_folder_is_registered_by_a_link_and_evicting_it_keeps_the_folder(cache, tmp_path):
    folder = tmp_path / "srv" / "llm"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"w" * 1000)
    result = cache.download(ModelDownloadPayload(model_id="local/llm", local_path=str(folder)), _quiet)
    assert result.size_bytes == 1002
    assert result.files == 2
    assert cache.path_for("local/llm") is not None
    assert (cache.path_for("local/llm") / "model.safetensors").read_bytes() == b"w" * 1000
    assert [(m.model_id, m.size_bytes) for m in cache.inventory()] == [("local/llm", 1002)]

    cache.evict(ModelEvictPayload(model_id="local/llm"))
    assert cache.path_for("local/llm") is None
    assert (folder / "model.safetensors").exists()  # the node's own folder stays

    empty = tmp_path / "srv" / "empty"
    empty.mkdir()
    with pytest.raises(CommandFailed) as refused:
        cache.download(ModelDownloadPayload(model_id="local/empty", local_path=str(empty)), _quiet)
    assert refused.value.code == "weights_missing"

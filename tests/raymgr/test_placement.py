"""Head and worker placement: the pure helpers, one test per failure reason and per preference."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from raymgr.placement import PlacementError, choose_head_node, choose_worker_node


def node(name: str, *, status: str = "online", total: int = 16000, used: int = 1000, gpus: int = 0):
    return SimpleNamespace(
        pk=name, name=name, status=status, memory_total_mb=total, memory_used_mb=used, gpu_count=gpus
    )


def head(nodes, ports=None, **kw):
    return choose_head_node(nodes, ports_in_use=ports or {}, gcs_port=6379, dashboard_port=8265, **kw)


def test_no_nodes_online():
    with pytest.raises(PlacementError) as err:
        head([node("a", status="offline"), node("b", status="cordoned")])
    assert err.value.code == "no_nodes_online"
    assert "No nodes online" in str(err.value)


def test_no_nodes_at_all():
    with pytest.raises(PlacementError) as err:
        head([])
    assert err.value.code == "no_nodes_online"


def test_insufficient_memory_names_the_best_node():
    with pytest.raises(PlacementError) as err:
        head([node("small", total=4000, used=1000), node("busy", total=64000, used=60500)])
    assert err.value.code == "insufficient_memory"
    assert "busy, has 3500 MB free" in err.value.message
    assert "4096 MB" in err.value.message


def test_exactly_four_gigabytes_free_is_enough():
    assert head([node("edge", total=5096, used=1000)]).name == "edge"


def test_port_conflict_on_every_roomy_node():
    nodes = [node("a"), node("b"), node("tiny", total=2000)]
    with pytest.raises(PlacementError) as err:
        head(nodes, ports={"a": {6379, 8266}, "b": {8265}})
    assert err.value.code == "port_conflict"
    assert "6379/8265" in err.value.message


def test_a_node_with_a_conflict_is_skipped_for_a_free_one():
    assert head([node("a", total=64000), node("b")], ports={"a": {8265}}).name == "b"


def test_prefers_cpu_nodes_then_most_free_memory():
    nodes = [node("gpu", total=512000, gpus=8), node("cpu-small"), node("cpu-big", total=32000)]
    assert head(nodes).name == "cpu-big"
    assert head([node("gpu", gpus=1), node("offline-cpu", status="offline")]).name == "gpu"


def test_worker_goes_to_another_node_one_per_node_gpu_first():
    nodes = [node("head"), node("cpu", total=128000), node("gpu", gpus=2), node("off", status="offline")]
    assert choose_worker_node(nodes, head_node_id="head", ray_nodes_per_node={"head": 1}).name == "gpu"
    taken = {"head": 1, "gpu": 1}
    assert choose_worker_node(nodes, head_node_id="head", ray_nodes_per_node=taken).name == "cpu"
    taken["cpu"] = 1
    assert choose_worker_node(nodes, head_node_id="head", ray_nodes_per_node=taken) is None


def test_process_runtime_shares_nodes_least_occupied_first():
    nodes = [node("only")]
    assert (
        choose_worker_node(nodes, head_node_id="only", ray_nodes_per_node={"only": 2}, share_nodes=True).name == "only"
    )
    two = [node("a"), node("b")]
    assert choose_worker_node(two, head_node_id="a", ray_nodes_per_node={"a": 1}, share_nodes=True).name == "b"

"""Placement on nodes without GPUs: each vLLM CPU server holds a core of its own and its memory (weights, KV
cache, vLLM itself) of the node's reported cores and memory, as VRAM is counted on GPU nodes."""

from __future__ import annotations

import pytest

from agent import protocol
from agent.protocol.cpu_engine import cpu_endpoint_memory_mb
from fleet.models import Node
from fleet.workloads import services as workloads
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.services import PlacementError
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db

TINY = protocol.CachedModel(model_id="acme/tiny", revision="main", path="/cache/tiny", size_bytes=200 * 1024 * 1024)


def cpu_node(register_node, cluster, name: str, *, cores: int, memory_mb: int) -> Node:
    """A node that reported no GPU, `cores` cores and `memory_mb` of memory, with TINY in its cache."""
    node = register_node(cluster, name)
    Node.objects.filter(pk=node.pk).update(
        gpus=[], gpu_count=0, vram_total_mb=0, vram_used_mb=0, cpu_count=cores, memory_total_mb=memory_mb
    )
    return agent_side.inventory(Node.objects.get(pk=node.pk), models=[TINY])


def test_six_cpu_servers_are_not_admitted_onto_one_two_core_node(cluster, register_node, owner, api_client_for):
    node = cpu_node(register_node, cluster, "cpu-box", cores=2, memory_mb=64_000)
    first = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=TINY.model_id)
    workloads.endpoint_create(actor=owner, cluster=cluster, model_id=TINY.model_id)
    for _ in range(4):
        with pytest.raises(PlacementError, match="insufficient CPU cores") as refused:
            workloads.endpoint_create(actor=owner, cluster=cluster, model_id=TINY.model_id)
        assert refused.value.code == "insufficient_cpu"
        assert "node cpu-box has 2, held by the 2 endpoint server(s) it runs" in str(refused.value)
    assert EndpointReplica.objects.filter(node=node).count() == 2

    response = api_client_for(owner).post(
        "/api/v1/endpoints/", {"cluster": str(cluster.pk), "model_id": TINY.model_id}, format="json"
    )
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "insufficient_cpu"
    assert "a vLLM CPU server needs 1 core(s) of its own" in body["detail"]
    assert "core of its own" in body["error_help"]["explanation"]

    # a stopped one gives its core back
    agent_side.result(first.start_command, port=8001)
    workloads.endpoint_stop(actor=owner, endpoint=Endpoint.objects.get(pk=first.pk))
    agent_side.result(Endpoint.objects.get(pk=first.pk).replicas.get().stop_command, endpoint_id=first.slug)
    assert first.replicas.get().status == EndpointStatus.STOPPED
    workloads.endpoint_create(actor=owner, cluster=cluster, model_id=TINY.model_id)


def test_cpu_servers_go_to_the_node_with_a_free_core(cluster, register_node, owner):
    small = cpu_node(register_node, cluster, "a-small", cores=1, memory_mb=64_000)
    big = cpu_node(register_node, cluster, "b-big", cores=4, memory_mb=64_000)
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=TINY.model_id, min_replicas=3)
    nodes = sorted(r.node_id for r in endpoint.replicas.all())
    assert nodes.count(small.pk) == 1
    assert nodes.count(big.pk) == 2


def test_memory_counts_each_server_s_weights_kv_cache_and_runtime(cluster, register_node, owner):
    per_server = cpu_endpoint_memory_mb(weights_bytes=TINY.size_bytes)
    assert per_server == 200 + 1024 + 2500
    cpu_node(register_node, cluster, "roomy-cores", cores=16, memory_mb=2 * per_server + 100)
    workloads.endpoint_create(actor=owner, cluster=cluster, model_id=TINY.model_id, min_replicas=2)
    with pytest.raises(PlacementError, match="insufficient memory") as refused:
        workloads.endpoint_create(actor=owner, cluster=cluster, model_id=TINY.model_id)
    assert refused.value.code == "insufficient_memory"
    assert f"needs about {per_server} MB" in str(refused.value)
    assert f"{2 * per_server} MB held by the 2 endpoint server(s)" in str(refused.value)


def test_gpu_nodes_are_counted_by_vram_not_cores(cluster, register_node, owner):
    node = register_node(cluster, "gpu-box")  # one H100, 16 cores reported
    Node.objects.filter(pk=node.pk).update(cpu_count=1)
    agent_side.inventory(node, models=[TINY])
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=TINY.model_id, min_replicas=2)
    assert [r.node_id for r in endpoint.replicas.all()] == [node.pk, node.pk]

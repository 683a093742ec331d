"""The home page: the fleet at a glance per workspace, each number linking to its page."""

from __future__ import annotations

import re
import uuid

import pytest
from django.utils import timezone

from agent import protocol
from fleet import services
from fleet.models import Command, CommandStatus, NodeStatus
from fleet.workloads.models import Container, ContainerStatus, EndpointStatus
from raymgr.models import RayCluster, RayClusterStatus
from tests.support.endpoints import endpoint_row

pytestmark = pytest.mark.django_db


def _tile(page: str, label: str) -> str:
    found = re.search(r'<span class="tile-value">([^<]+)</span> ' + re.escape(label), page)
    assert found, label
    return found[1]


def _gpu_beat(used_mb: int) -> protocol.Heartbeat:
    gpus = [
        protocol.GpuInfo(index=0, name="H100", memory_total_mb=81920, memory_used_mb=used_mb, utilization_percent=0),
        protocol.GpuInfo(index=1, name="H100", memory_total_mb=81920, memory_used_mb=0, utilization_percent=0),
    ]
    return protocol.Heartbeat(cpu_percent=5, memory_percent=5, gpus=gpus)


def _world(cluster, register_node, owner, n_extra: int = 0):
    busy = register_node(cluster, "busy")
    services.node_record_heartbeat(node_id=busy.pk, heartbeat=_gpu_beat(40960))
    register_node(cluster, "gone", online=False)
    cordoned = register_node(cluster, "resting")
    services.node_cordon(node=cordoned, actor=owner)
    for i in range(n_extra):
        register_node(cluster, f"extra-{i}")
    Container.objects.create(node=busy, cluster=cluster, name="web", image="busybox", status=ContainerStatus.RUNNING)
    Container.objects.create(node=busy, cluster=cluster, name="old", image="busybox", status=ContainerStatus.EXITED)
    endpoint_row(cluster=cluster, node=busy, model_id="acme/tiny", status=EndpointStatus.RUNNING)
    RayCluster.objects.create(
        workspace=cluster.workspace, compute_cluster=cluster, name="ray-up", status=RayClusterStatus.RUNNING
    )
    Command.objects.create(
        node=busy,
        cluster=cluster,
        command_type="container.create",
        idempotency_key=uuid.uuid4().hex,
        status=CommandStatus.FAILED,
        finished_at=timezone.now(),
        error_message="Traceback (most recent call last):\n  File x\nRuntimeError: image not found",
    )
    return busy


def test_home_shows_each_workspace_at_a_glance_with_links(client, owner, workspace, cluster, register_node):
    busy = _world(cluster, register_node, owner)
    client.force_login(owner)
    page = client.get("/").content.decode()
    assert "<h1>Fleet</h1>" in page
    assert _tile(page, "nodes online") == "1"
    assert _tile(page, "offline") == "1"
    assert _tile(page, "cordoned") == "1"
    assert _tile(page, "GPUs in use") == "2 / 3"  # busy: 1 of 2; resting (cordoned): 1 of 1; gone: none known
    assert _tile(page, "VRAM in use") == "40.1 / 316.2 GB"  # the offline node counts in the total only
    assert _tile(page, "containers running") == "1"
    assert _tile(page, "endpoints running") == "1"
    assert _tile(page, "Ray clusters running") == "1"
    assert f'href="/compute/clusters/{cluster.pk}/nodes/"' in page
    assert 'href="/ray/clusters/"' in page
    # each tile opens a page, never the raw REST API (the endpoints tile opened /api/v1/endpoints/)
    tiles = re.findall(r'<a href="([^"]+)"><span class="tile-value">', page)
    assert tiles
    assert not [href for href in tiles if href.startswith("/api/")], tiles
    assert re.search(r'<a href="/compute/endpoints/"><span class="tile-value">1</span> endpoints running', page)
    # the failure shows the traceback's last line and links to the node it failed on
    assert f'<a href="/compute/nodes/{busy.pk}/">container.create on busy</a>' in page
    assert "RuntimeError: image not found" in page
    assert "most recent call last" not in page


def test_home_shows_only_own_workspaces(client, owner, workspace, other_cluster, register_node):
    register_node(other_cluster, "theirs-node")
    client.force_login(owner)
    page = client.get("/").content.decode()
    assert workspace.name in page
    assert other_cluster.workspace.name not in page
    assert _tile(page, "nodes online") == "0"


def test_home_query_count_is_constant(client, owner, workspace, cluster, register_node, django_assert_num_queries):
    _world(cluster, register_node, owner)
    client.force_login(owner)
    client.get("/")
    with django_assert_num_queries(14) as first:  # 11 + the charts' commands per minute + quota limits, usage
        client.get("/")
    for i in range(3):
        services.cluster_create(actor=owner, workspace=workspace, name=f"more-{i}")
    register_node(cluster, "late")
    with django_assert_num_queries(len(first.captured_queries)):
        page = client.get("/").content.decode()
    assert _tile(page, "nodes online") == "2"
    assert NodeStatus.CORDONED.label in "Cordoned"

"""Workspace quotas on managed Ray: cluster create and start, the head, min_workers and the autoscaler
(which stop at the quota and say why on the cluster page), KubeRay worker groups."""

from __future__ import annotations

import pytest

from fleet import services as fleet_services
from fleet.models import Command
from kernel.exceptions import QuotaExceeded
from raymgr import services
from raymgr.models import RayCluster, RayNode, RayNodeStatus
from raymgr.versions import default_version
from tenancy import services as tenancy_services
from tests.raymgr.conftest import finish, last_command, start_head

pytestmark = pytest.mark.django_db


def limit(owner, workspace, **limits) -> None:
    tenancy_services.workspace_quota_set(actor=owner, workspace=workspace, limits=limits)


def worker_starts(cluster) -> int:
    return Command.objects.filter(command_type="ray.worker.start", payload__cluster_id=str(cluster.pk)).count()


def test_ray_cluster_create_is_refused_at_the_clusters_quota(owner, workspace, compute, add_node, make_ray):
    add_node(compute, "n1")
    limit(owner, workspace, ray_clusters=1)
    make_ray("one")
    with pytest.raises(QuotaExceeded) as refused:
        make_ray("two")
    assert (refused.value.quota, refused.value.limit, refused.value.in_use, refused.value.asked) == (
        "ray_clusters",
        1,
        1,
        1,
    )
    assert list(RayCluster.objects.values_list("name", flat=True)) == ["one"]


def test_the_head_asks_for_its_node_and_a_refusal_writes_nothing(owner, workspace, compute, add_node, make_ray):
    add_node(compute, "n1", memory_mb=64000)  # 16 CPU cores
    limit(owner, workspace, cpu_cores=8)
    with pytest.raises(QuotaExceeded) as refused:
        make_ray("big")
    assert (refused.value.quota, refused.value.asked) == ("cpu_cores", 16.0)
    assert not RayCluster.objects.exists()
    assert not RayNode.objects.exists()
    assert not Command.objects.filter(command_type="ray.head.start").exists()


def test_api_create_refusal_is_a_409_with_the_quota_fields(owner, workspace, compute, add_node, api_client_for):
    add_node(compute, "n1")
    limit(owner, workspace, ray_clusters=0)
    body = {"workspace": str(workspace.pk), "compute_cluster": str(compute.pk), "name": "r1", "runtime": "process"}
    response = api_client_for(owner).post("/api/v1/ray/clusters/", body, format="json")
    assert response.status_code == 409, response.content
    assert {k: response.json()[k] for k in ("quota", "limit", "in_use", "asked")} == {
        "quota": "ray_clusters",
        "limit": 0,
        "in_use": 0,
        "asked": 1,
    }


def test_create_page_shows_the_refusal(client, owner, workspace, compute, add_node):
    add_node(compute, "n1")
    limit(owner, workspace, ray_clusters=0)
    client.force_login(owner)
    response = client.post(
        "/ray/clusters/new/",
        {
            "compute_cluster": str(compute.pk),
            "name": "r1",
            "runtime": "process",
            "ray_version": default_version("process"),
            "min_workers": 0,
            "max_workers": 1,
            "idle_timeout_s": 60,
            "dashboard_port": 8265,
        },
    )
    assert response.status_code == 409, response.content.decode()[:2000]
    assert "Quota exceeded: Ray clusters is limited to 0" in response.content.decode()


def test_start_of_a_stopped_cluster_is_admitted(owner, workspace, compute, add_node, make_ray):
    add_node(compute, "n1")
    cluster = make_ray("one")
    start_head(cluster)
    services.ray_cluster_stop(actor=owner, cluster=cluster)
    finish(last_command("ray.node.stop", cluster_id=str(cluster.pk)))
    cluster.refresh_from_db()
    assert cluster.status == "stopped"
    limit(owner, workspace, memory_gib=10)  # the head asks for its node's 64000 MB
    with pytest.raises(QuotaExceeded) as refused:
        services.ray_cluster_start(actor=owner, cluster=cluster)
    assert refused.value.quota == "memory_gib"
    cluster.refresh_from_db()
    assert cluster.status == "stopped"


@pytest.fixture
def running(owner, compute, add_node, make_ray):
    """A running cluster (head on cpu-head) with three more nodes for workers."""
    for name in ("cpu-head", "w-1", "w-2", "w-3"):
        add_node(compute, name)
    cluster = make_ray(max_workers=3, idle_timeout_s=60)
    start_head(cluster)
    return cluster


def test_min_workers_stop_at_the_ray_workers_quota_and_the_page_says_why(client, owner, workspace, running):
    limit(owner, workspace, ray_workers=1)
    services.ray_cluster_update(actor=owner, cluster=running, min_workers=3)
    services.ray_cluster_autoscale(cluster=running)
    assert worker_starts(running) == 1
    running.refresh_from_db()
    assert "Ray workers is limited to 1" in running.quota_block
    assert "1 of 3 worker(s) started" in running.events.get(kind="quota").message
    client.force_login(owner)
    head = client.get(f"/ray/clusters/{running.pk}/?part=head", HTTP_HX_REQUEST="true").content.decode()
    assert "Workers not added" in head
    assert "Ray workers is limited to 1" in head
    services.ray_cluster_autoscale(cluster=running)  # the same block again: no new event
    assert worker_starts(running) == 1
    assert running.events.filter(kind="quota").count() == 1
    limit(owner, workspace, ray_workers=None)  # raised: the next pass adds the rest and the line goes
    services.ray_cluster_autoscale(cluster=running)
    assert worker_starts(running) == 3
    running.refresh_from_db()
    assert running.quota_block == ""
    assert "Workers not added" not in client.get(f"/ray/clusters/{running.pk}/").content.decode()


def test_autoscaler_scale_up_stops_at_the_cpu_quota(owner, workspace, running):
    head_cores = 16
    limit(owner, workspace, cpu_cores=head_cores + 16)  # room for one 16-core worker
    services.ray_cluster_update(actor=owner, cluster=running, min_workers=2)
    services.ray_cluster_autoscale(cluster=running)
    assert worker_starts(running) == 1
    running.refresh_from_db()
    assert "CPU cores is limited to 32" in running.quota_block
    live = RayNode.objects.filter(ray_cluster=running, status__in=RayNodeStatus.live())
    assert sum(n.req_cpus for n in live) == 32


def test_lowering_the_quota_stops_no_worker(owner, workspace, running):
    services.ray_cluster_update(actor=owner, cluster=running, min_workers=2)
    services.ray_cluster_autoscale(cluster=running)
    assert worker_starts(running) == 2
    limit(owner, workspace, ray_workers=0, cpu_cores=1)
    services.ray_cluster_autoscale(cluster=running)
    assert RayNode.objects.filter(ray_cluster=running, role="worker", status=RayNodeStatus.STARTING).count() == 2
    assert not Command.objects.filter(command_type__in=["ray.node.stop", "ray.node.drain"]).exists()


def test_kuberay_head_reserves_its_worker_group(owner, workspace, add_node):
    kube = fleet_services.cluster_create(actor=owner, workspace=workspace, name="kube", mode="kubernetes")
    add_node(kube, "k1")
    limit(owner, workspace, ray_workers=3)
    with pytest.raises(QuotaExceeded) as refused:
        services.ray_cluster_create(actor=owner, workspace=workspace, compute_cluster=kube, name="kr", max_workers=4)
    assert (refused.value.quota, refused.value.asked) == ("ray_workers", 4)
    cluster = services.ray_cluster_create(
        actor=owner, workspace=workspace, compute_cluster=kube, name="kr", max_workers=3, worker_cpus=2.0
    )
    head = RayNode.objects.get(ray_cluster=cluster)
    assert (head.req_workers, head.req_cpus) == (3, 6.0)

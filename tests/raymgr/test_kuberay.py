"""Ray clusters on kubernetes and argocd compute clusters: one KubeRay RayCluster, applied by an agent.

Agent answers are fed through fleet's command_record_* services, as the tunnel consumer does.
"""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.test import Client

from fleet import services as fleet_services
from fleet.models import Command
from raymgr import services
from raymgr.models import RayCluster, RayClusterStatus, RayNode, RayNodeStatus, RayRuntime
from raymgr.workloads import services as workload_services
from raymgr.workloads.models import ServeDeployment
from tests.raymgr.conftest import finish, last_command

pytestmark = pytest.mark.django_db


@pytest.fixture
def browser(owner) -> Client:
    client = Client()
    client.force_login(owner)
    return client


@pytest.fixture
def kube(owner, workspace):
    return fleet_services.cluster_create(actor=owner, workspace=workspace, name="k8s", mode="kubernetes")


@pytest.fixture
def gitops(owner, workspace):
    return fleet_services.cluster_create(
        actor=owner,
        workspace=workspace,
        name="gitops",
        mode="argocd",
        argocd_server="https://argocd.example.test",
        argocd_token="tok",
        git_repo_url="https://git.example.test/ops.git",
    )


def create(owner, workspace, compute, **kwargs):
    values = {"name": "train", "min_workers": 1, "max_workers": 4, "worker_cpus": 2.0, "worker_memory_mb": 4096}
    values.update(kwargs)
    return services.ray_cluster_create(actor=owner, workspace=workspace, compute_cluster=compute, **values)


def applied(cluster, host="train-x-head-svc.cleverthis-workloads.svc", **extra):
    command = last_command("ray.head.start", cluster_id=str(cluster.pk))
    data = {"container_id": cluster.kuberay_name, "ray_node_id": "", "ip": "", "hostname": host, **extra}
    finish(command, data=data)
    cluster.refresh_from_db()
    return command


def test_on_a_kubernetes_cluster_create_sends_one_raycluster_apply_to_an_online_agent(owner, workspace, kube, add_node):
    add_node(kube, "b-agent")
    agent = add_node(kube, "a-agent")
    add_node(kube, "off", online=False)

    cluster = create(owner, workspace, kube, runtime="docker", worker_gpus=1, idle_timeout_s=60)

    assert cluster.runtime == RayRuntime.KUBERAY
    assert cluster.status == RayClusterStatus.PENDING
    command = last_command("ray.head.start", cluster_id=str(cluster.pk))
    assert command.node_id == agent.pk
    p = command.payload
    assert p["runtime"] == "kuberay"
    assert p["name"] == cluster.kuberay_name
    assert cluster.kuberay_name == f"train-{cluster.pk.hex[:8]}"
    assert (p["min_workers"], p["max_workers"], p["idle_timeout_s"]) == (1, 4, 60)
    assert (p["worker_cpus"], p["worker_memory_mb"], p["worker_gpus"]) == (2.0, 4096, 1)
    assert p["image"] == f"rayproject/ray:{cluster.ray_version}"
    assert p["worker_image"] == f"rayproject/ray:{cluster.ray_version}-gpu"
    assert cluster.events.filter(kind="placement", message__contains="applies it").exists()


def test_the_image_follows_the_settings_template(owner, workspace, kube, add_node, settings):
    settings.RAY_IMAGE_TEMPLATE = "registry.example.test/ray:{version}-py311"
    settings.RAY_GPU_IMAGE_TEMPLATE = "registry.example.test/ray:{version}-gpu-py311"
    add_node(kube, "agent")

    cluster = create(owner, workspace, kube, worker_gpus=2)

    p = last_command("ray.head.start", cluster_id=str(cluster.pk)).payload
    assert p["image"] == f"registry.example.test/ray:{cluster.ray_version}-py311"
    assert p["worker_image"] == f"registry.example.test/ray:{cluster.ray_version}-gpu-py311"


def test_applied_means_running_with_the_head_service_and_no_worker_starts(owner, workspace, kube, add_node):
    add_node(kube, "agent")
    add_node(kube, "other")
    cluster = create(owner, workspace, kube, min_workers=2)

    applied(cluster)

    assert cluster.status == RayClusterStatus.RUNNING
    assert cluster.head_hostname == "train-x-head-svc.cleverthis-workloads.svc"
    assert cluster.head_service_host == cluster.head_hostname
    assert cluster.head_container_id == cluster.kuberay_name
    assert not Command.objects.filter(command_type="ray.worker.start").exists()
    assert cluster.events.filter(kind="kuberay", message__contains="KubeRay's autoscaler").exists()


def test_autoscaler_pass_only_asks_for_status_and_the_status_is_recorded(owner, workspace, kube, add_node):
    add_node(kube, "agent")
    cluster = create(owner, workspace, kube, min_workers=0)
    applied(cluster)

    services.ray_cluster_autoscale(cluster=cluster)

    status_command = last_command("ray.status", cluster_id=str(cluster.pk))
    assert status_command.payload["runtime"] == "kuberay"
    assert not Command.objects.filter(command_type__in=["ray.worker.start", "ray.node.drain"]).exists()
    head = RayNode.objects.get(ray_cluster=cluster, role="head")
    result = {
        "nodes": [
            {"ray_node_id": "aa" * 28, "member_id": str(head.pk), "is_head": True, "resources": {"CPU": 1.0}},
            {"ray_node_id": "bb" * 28, "member_id": "", "is_head": False, "resources": {"CPU": 2.0}},
        ],
        "pending": [],
        "kuberay": {"state": "ready", "ready_workers": 1, "desired_workers": 1, "head_host": "10.96.0.12"},
    }
    finish(status_command, data=result)
    cluster.refresh_from_db()
    head.refresh_from_db()
    assert cluster.last_status["kuberay"]["state"] == "ready"
    assert cluster.head_hostname == "10.96.0.12"
    assert head.ray_node_id == "aa" * 28


def test_stop_suspends_start_resumes_and_delete_deletes(owner, workspace, kube, add_node):
    add_node(kube, "agent")
    cluster = create(owner, workspace, kube)
    applied(cluster)

    cluster = services.ray_cluster_stop(actor=owner, cluster=cluster)

    stop = last_command("ray.node.stop", cluster_id=str(cluster.pk))
    assert stop.payload["runtime"] == "kuberay"
    assert not stop.payload.get("delete")  # suspend: the RayCluster stays
    finish(stop, data={"stopped": True, "suspended": True})
    assert RayNode.objects.get(ray_cluster=cluster).status == RayNodeStatus.STOPPED

    cluster = services.ray_cluster_start(actor=owner, cluster=cluster)
    restart = last_command("ray.head.start", cluster_id=str(cluster.pk))
    assert restart.payload["name"] == cluster.kuberay_name
    applied(cluster, resumed=True)
    assert cluster.status == RayClusterStatus.RUNNING
    assert cluster.events.filter(kind="kuberay", message__contains="resumed").exists()

    assert services.ray_cluster_delete(actor=owner, cluster=cluster) is not None
    delete = last_command("ray.node.stop", cluster_id=str(cluster.pk))
    assert delete.pk != stop.pk
    assert delete.payload["delete"] is True
    finish(delete, data={"stopped": True, "deleted": True})
    assert not type(cluster).objects.filter(pk=cluster.pk).exists()


def test_argocd_clusters_run_kuberay_too(owner, workspace, gitops, add_node):
    add_node(gitops, "agent")

    cluster = create(owner, workspace, gitops)

    assert cluster.runtime == RayRuntime.KUBERAY
    assert last_command("ray.head.start", cluster_id=str(cluster.pk)).payload["runtime"] == "kuberay"
    assert cluster.events.filter(kind="placement", message__contains="commits it for ArgoCD").exists()


def test_kuberay_is_refused_on_standalone_and_worker_sizes_are_checked(owner, workspace, compute, kube, add_node):
    add_node(compute, "box")
    with pytest.raises(ValidationError) as caught:
        create(owner, workspace, compute, runtime="kuberay")
    assert "standalone" in caught.value.message_dict["runtime"][0]
    with pytest.raises(ValidationError) as bad:
        create(owner, workspace, kube, worker_cpus=0, worker_memory_mb=10, worker_gpus=-1)
    assert set(bad.value.message_dict) == {"worker_cpus", "worker_memory_mb", "worker_gpus"}


def test_no_online_agent_fails_with_a_reason(owner, workspace, kube, add_node):
    add_node(kube, "off", online=False)

    cluster = create(owner, workspace, kube)

    assert cluster.status == RayClusterStatus.FAILED
    assert "no agent can apply the RayCluster" in cluster.failure_reason


def test_an_agent_refusal_without_the_crd_fails_the_cluster_with_the_install_hint(owner, workspace, kube, add_node):
    add_node(kube, "agent")
    cluster = create(owner, workspace, kube)
    command = last_command("ray.head.start", cluster_id=str(cluster.pk))
    message = "The KubeRay operator is not installed … install the KubeRay operator (https://docs.ray.io/…)"

    finish(command, ok=False, code="kuberay_missing", message=message)

    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.FAILED
    assert "install the KubeRay operator" in cluster.failure_reason


def test_workloads_and_serve_traffic_go_to_the_head_service(owner, workspace, kube, add_node):
    add_node(kube, "agent")
    cluster = create(owner, workspace, kube)
    applied(cluster, host="10.96.0.12")

    deployment = workload_services.serve_deployment_create(
        actor=owner, workspace=workspace, ray_cluster=cluster, name="svc", http_port=8000
    )

    submit = last_command("ray.job.submit", cluster_id=str(cluster.pk))
    assert submit.payload["host"] == "10.96.0.12"
    assert submit.payload["runtime"] == "kuberay"
    assert submit.node_id == cluster.head_node_id
    assert ServeDeployment.objects.get(pk=deployment.pk).ray_cluster.head_service_host == "10.96.0.12"


def test_serve_and_dashboard_targets_carry_the_head_service_host(owner, workspace, kube, add_node):
    from rest_framework.authtoken.models import Token

    from fleet import origin_names
    from fleet.proxy.resolvers import ProxyTarget
    from raymgr.workloads.serve_proxy import decide

    add_node(kube, "agent")
    cluster = create(owner, workspace, kube)
    applied(cluster, host="10.96.0.12")
    deployment = workload_services.serve_deployment_create(
        actor=owner, workspace=workspace, ray_cluster=cluster, name="svc", http_port=8000
    )
    ServeDeployment.objects.filter(pk=deployment.pk).update(status="running")
    token = Token.objects.get_or_create(user=owner)[0].key
    scope = {
        "type": "http",
        "path": "/",
        "headers": [
            (b"host", origin_names.SERVE.host(deployment.pk).encode()),
            (b"authorization", f"Token {token}".encode()),
        ],
        "query_string": b"",
    }

    target = decide(scope, str(deployment.pk))

    assert isinstance(target, ProxyTarget)
    assert (target.host, target.port, target.node_id) == ("10.96.0.12", 8000, cluster.head_node_id)


def test_the_page_creates_a_kuberay_cluster_and_shows_kuberays_view(browser, kube, add_node):
    add_node(kube, "agent")
    form = {
        "name": "pods",
        "compute_cluster": str(kube.pk),
        "ray_version": "2.60.0",
        "runtime": "docker",
        "min_workers": "1",
        "max_workers": "3",
        "idle_timeout_s": "60",
        "worker_cpus": "4",
        "worker_memory_mb": "8192",
        "worker_gpus": "1",
        "gcs_port": "6379",
        "dashboard_port": "8265",
    }

    response = browser.post("/ray/clusters/new/", form)

    cluster = RayCluster.objects.get(name="pods")
    assert response.status_code == 302
    assert (cluster.runtime, cluster.worker_cpus, cluster.worker_memory_mb, cluster.worker_gpus) == (
        "kuberay",
        4.0,
        8192,
        1,
    )
    applied(cluster, host="10.96.0.12")
    head = RayNode.objects.get(ray_cluster=cluster)
    status = {
        "nodes": [
            {"ray_node_id": "aa" * 28, "member_id": str(head.pk), "is_head": True},
            {"ray_node_id": "bb" * 28, "member_id": "", "is_head": False},
        ],
        "kuberay": {"state": "ready", "ready_workers": 1, "desired_workers": 1, "head_host": "10.96.0.12"},
    }
    services.ray_cluster_record_status(cluster=cluster, status=status)
    page = browser.get(f"/ray/clusters/{cluster.pk}/").content.decode()
    assert "KubeRay RayCluster" in page
    assert f"{cluster.kuberay_name} in cleverthis-workloads: ready" in page
    assert "1 ready of 1 wanted workers" in page
    assert "4.0 CPU, 8192 MB, 1 GPU each" in page


def test_the_api_creates_a_kuberay_cluster_with_worker_sizes_and_refuses_bad_ones(
    api_client_for, owner, workspace, kube, add_node
):
    add_node(kube, "agent")
    client = api_client_for(owner)
    base = {"workspace": str(workspace.pk), "compute_cluster": str(kube.pk)}

    response = client.post(
        "/api/v1/ray/clusters/",
        {**base, "name": "api", "worker_cpus": 3, "worker_memory_mb": 6144, "worker_gpus": 2},
        format="json",
    )

    assert response.status_code == 201, response.content
    data = response.json()
    assert (data["runtime"], data["worker_cpus"], data["worker_memory_mb"], data["worker_gpus"]) == (
        "kuberay",
        3.0,
        6144,
        2,
    )
    bad = client.post("/api/v1/ray/clusters/", {**base, "name": "bad", "worker_memory_mb": 1}, format="json")
    assert bad.status_code == 400
    assert "worker_memory_mb" in bad.json()


def test_delete_right_after_stop_deletes_the_raycluster_once_its_suspend_is_over(owner, workspace, kube, add_node):
    add_node(kube, "agent")
    cluster = create(owner, workspace, kube)
    applied(cluster)
    services.ray_cluster_stop(actor=owner, cluster=cluster)
    assert services.ray_cluster_delete(actor=owner, cluster=RayCluster.objects.get(pk=cluster.pk)) is not None
    stops = Command.objects.filter(command_type="ray.node.stop", payload__cluster_id=str(cluster.pk))
    (suspend,) = stops  # no second stop while the suspend is in flight
    assert not suspend.payload.get("delete")
    finish(suspend, data={"stopped": True, "suspended": True})
    delete = last_command("ray.node.stop", cluster_id=str(cluster.pk))
    assert delete.pk != suspend.pk
    assert delete.payload["delete"] is True  # the suspended RayCluster is not left behind
    assert RayCluster.objects.filter(pk=cluster.pk).exists()
    finish(delete, data={"stopped": True, "deleted": True})
    assert not RayCluster.objects.filter(pk=cluster.pk).exists()

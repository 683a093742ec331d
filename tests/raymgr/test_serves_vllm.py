"""A Ray cluster that serves vLLM (`RayCluster.serves_vllm`): its containers run the Ray image carrying vLLM,
refused with a field message where its runtime or Ray version cannot; its Ray nodes are what a distributed
endpoint's ranks then run inside (`tests/raymgr/test_endpoint_groups.py`)."""

from __future__ import annotations

import pytest
from django.test import Client

from fleet.models import Command
from raymgr.models import RayCluster, RayClusterStatus

pytestmark = pytest.mark.django_db

URL = "/api/v1/ray/clusters/"


@pytest.fixture(autouse=True)
def versions(settings):
    settings.RAY_VERSIONS = ["2.9.0", "2.60.0"]
    settings.RAY_PROCESS_VERSION = "2.60.0"
    settings.RAY_VLLM_VERSIONS = {"2.60.0": "0.32.0"}
    settings.RAY_VLLM_IMAGE_TEMPLATE = "registry.example.test/ray-vllm:{version}-vllm{vllm}"
    settings.RAY_VLLM_GPU_IMAGE_TEMPLATE = "registry.example.test/ray-vllm:{version}-vllm{vllm}-gpu"


def body(workspace, compute, **extra):
    return {"workspace": str(workspace.pk), "compute_cluster": str(compute.pk), "name": "vl", **extra}


def test_its_head_runs_the_vllm_image_and_the_api_says_so(api_client_for, owner, workspace, compute, add_node):
    add_node(compute, "cpu-1")
    client = api_client_for(owner)
    created = client.post(URL, body(workspace, compute, ray_version="2.60.0", serves_vllm=True), format="json")
    assert created.status_code == 201, created.content
    assert created.json()["serves_vllm"] is True
    assert Command.objects.get(command_type="ray.head.start").payload["image"] == (
        "registry.example.test/ray-vllm:2.60.0-vllm0.32.0"
    )


def test_a_gpu_node_gets_the_gpu_variant(make_ray, compute, add_node):
    add_node(compute, "gpu-1", gpus=1)
    make_ray(ray_version="2.60.0", serves_vllm=True)
    assert Command.objects.get(command_type="ray.head.start").payload["image"].endswith("-vllm0.32.0-gpu")


def test_a_ray_version_without_a_vllm_pair_is_a_400_on_the_field(api_client_for, owner, workspace, compute, add_node):
    add_node(compute, "cpu-1")
    refused = api_client_for(owner).post(
        URL, body(workspace, compute, ray_version="2.9.0", serves_vllm=True), format="json"
    )
    assert refused.status_code == 400
    assert refused.json() == {"serves_vllm": ["No vLLM release is paired with Ray 2.9.0 (RAY_VLLM_VERSIONS: 2.60.0)."]}
    assert not Command.objects.exists()


def test_only_the_docker_runtime_serves_vllm(api_client_for, owner, workspace, compute, add_node):
    add_node(compute, "cpu-1")
    refused = api_client_for(owner).post(
        URL, body(workspace, compute, ray_version="2.60.0", runtime="process", serves_vllm=True), format="json"
    )
    assert refused.status_code == 400
    assert refused.json() == {"serves_vllm": ["Only a docker-runtime Ray cluster runs the Ray image carrying vLLM."]}


def test_its_ray_version_cannot_change_to_one_without_a_vllm_pair(api_client_for, owner, make_ray, compute, add_node):
    add_node(compute, "cpu-1")
    cluster = make_ray(ray_version="2.60.0", serves_vllm=True)
    RayCluster.objects.filter(pk=cluster.pk).update(status=RayClusterStatus.STOPPED)  # a version changes when stopped
    client = api_client_for(owner)
    refused = client.patch(f"{URL}{cluster.pk}/", {"ray_version": "2.9.0"}, format="json")
    assert refused.status_code == 400, refused.content
    assert "serves_vllm" in refused.json()
    cluster.refresh_from_db()
    assert cluster.ray_version == "2.60.0"


def test_a_cluster_not_serving_vllm_keeps_the_plain_ray_image(make_ray, compute, add_node):
    add_node(compute, "cpu-1")
    make_ray(ray_version="2.60.0")
    assert Command.objects.get(command_type="ray.head.start").payload["image"] == "rayproject/ray:2.60.0"


def test_the_create_form_refuses_an_unpaired_version_on_the_field_and_the_page_says_it_serves_vllm(
    owner, compute, add_node
):
    add_node(compute, "cpu-1")
    browser = Client()
    browser.force_login(owner)
    assert 'name="serves_vllm"' in browser.get("/ray/clusters/new/").content.decode()
    form = {
        "name": "vl",
        "compute_cluster": str(compute.pk),
        "ray_version": "2.9.0",
        "runtime": "docker",
        "min_workers": "0",
        "max_workers": "1",
        "idle_timeout_s": "60",
        "dashboard_port": "8265",
        "serves_vllm": "on",
    }
    refused = browser.post("/ray/clusters/new/", form)
    assert refused.status_code == 400
    assert "No vLLM release is paired with Ray 2.9.0" in refused.content.decode()
    created = browser.post("/ray/clusters/new/", {**form, "ray_version": "2.60.0"})
    assert created.status_code == 302
    cluster = RayCluster.objects.get()
    assert cluster.serves_vllm
    assert "serves vLLM" in browser.get(f"/ray/clusters/{cluster.pk}/").content.decode()

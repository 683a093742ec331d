"""KubeRay: the RayCluster manifest, the kube backend against the Kubernetes API stand-in (ray.io/v1
paths, CRD missing), and the argocd backend on a real local bare repository with the sync stand-in."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent import protocol
from agent.errors import CommandFailed
from agent.executors import manifests as mf
from agent.executors.argocd import ArgoCDExecutor
from agent.executors.kubernetes import KubernetesExecutor
from agent.protocol import RayHeadStartPayload, RayNodeStopPayload, RayStatusPayload, parse_payload
from agent.ray import kuberay
from agent.ray.commands import RayCommandHandler
from tests.support import raycluster_schema
from tests.support.argocd_standin import ArgoCDStandin
from tests.support.k8s_standin import K8sStandin
from tests.support.ray_head_standin import RayHeadStandin, node_row

NS = mf.NAMESPACE
CLUSTER = "6f1c2d3e-0000-4000-8000-000000000001"
BRANCH = "deploy"


def quiet(*_args: object, **_kwargs: object) -> None:
    """A ProgressFn that ignores its calls."""


def head_payload(**overrides: object) -> dict:
    values: dict = {
        "cluster_id": CLUSTER,
        "member_id": "head-1",
        "ray_version": "2.60.0",
        "image": "rayproject/ray:2.60.0",
        "runtime": "kuberay",
        "gcs_port": 6380,
        "dashboard_port": 8265,
        "name": "train-6f1c2d3e",
        "min_workers": 1,
        "max_workers": 4,
        "idle_timeout_s": 60,
        "worker_cpus": 2.0,
        "worker_memory_mb": 4096,
        "worker_gpus": 1,
        "worker_image": "rayproject/ray:2.60.0-gpu",
    }
    values.update(overrides)
    return values


def start(**overrides: object) -> RayHeadStartPayload:
    return parse_payload("ray.head.start", head_payload(**overrides))


# ---- the manifest


def test_manifest_has_a_head_and_one_autoscaled_worker_group_sized_from_the_payload():
    manifest = kuberay.raycluster_manifest(start())

    assert raycluster_schema.problems(manifest) == []
    assert manifest["apiVersion"] == "ray.io/v1"
    assert manifest["kind"] == "RayCluster"
    meta = manifest["metadata"]
    assert meta["name"] == "train-6f1c2d3e"
    assert meta["namespace"] == NS
    assert meta["labels"] == {
        mf.MANAGED_BY_LABEL: "cleverthis",
        mf.NAME_LABEL: "train-6f1c2d3e",
        kuberay.CLUSTER_LABEL: CLUSTER,
    }
    spec = manifest["spec"]
    assert spec["rayVersion"] == "2.60.0"
    assert spec["suspend"] is False
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"]["idleTimeoutSeconds"] == 60
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["port"] == "6380"
    assert head["rayStartParams"]["dashboard-port"] == "8265"
    [head_container] = head["template"]["spec"]["containers"]
    assert head_container["image"] == "rayproject/ray:2.60.0"
    assert {p["containerPort"] for p in head_container["ports"]} == {6380, 8265, 10001, 8000}
    assert head["template"]["metadata"]["labels"][mf.MANAGED_BY_LABEL] == "cleverthis"
    [group] = spec["workerGroupSpecs"]
    assert (group["groupName"], group["minReplicas"], group["maxReplicas"], group["replicas"]) == ("workers", 1, 4, 1)
    [worker] = group["template"]["spec"]["containers"]
    assert worker["image"] == "rayproject/ray:2.60.0-gpu"
    assert worker["resources"]["requests"] == {"cpu": "2000m", "memory": "4096Mi"}
    assert worker["resources"]["limits"] == {"cpu": "2000m", "memory": "4096Mi", "nvidia.com/gpu": "1"}
    assert group["rayStartParams"] == {"num-gpus": "1"}


def test_manifest_without_worker_resources_or_gpus_still_matches_the_schema():
    manifest = kuberay.raycluster_manifest(start(worker_cpus=0.0, worker_memory_mb=0, worker_gpus=0, worker_image=""))

    assert raycluster_schema.problems(manifest) == []
    [worker] = manifest["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"]
    assert "resources" not in worker
    assert worker["image"] == "rayproject/ray:2.60.0"


def test_the_schema_catches_what_the_crd_would_refuse():
    manifest = kuberay.raycluster_manifest(start())
    manifest["spec"]["enableInTreeAutoScaling"] = True  # misspelt
    manifest["spec"]["workerGroupSpecs"][0]["maxReplicas"] = "4"
    manifest["spec"]["headGroupSpec"]["rayStartParams"]["port"] = 6380

    found = raycluster_schema.problems(manifest)

    assert ".spec.enableInTreeAutoScaling: unknown field" in found
    assert ".spec.workerGroupSpecs[0].maxReplicas: expected an integer" in found
    assert ".spec.headGroupSpec.rayStartParams[port]: expected a string" in found


def test_manifest_refuses_bounds_the_wrong_way_round_and_overlong_names():
    with pytest.raises(ValueError, match="max_workers"):
        kuberay.raycluster_manifest(start(min_workers=3, max_workers=2))
    with pytest.raises(ValueError, match="longer than 50"):
        kuberay.raycluster_manifest(start(name="x" * 60))


# ---- kubernetes mode


@pytest.fixture
def head_api() -> Iterator[RayHeadStandin]:
    standin = RayHeadStandin([node_row("aa" * 28, head=True), node_row("bb" * 28, head=False, cpus=2.0)]).start()
    yield standin
    standin.stop()


@pytest.fixture
def api() -> Iterator[K8sStandin]:
    standin = K8sStandin(ray_service_ip="127.0.0.1").start()
    yield standin
    standin.stop()


@pytest.fixture
def handler(api: K8sStandin, tmp_path: Path) -> RayCommandHandler:
    executor = KubernetesExecutor(kubeconfig_path=str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    return RayCommandHandler(kuberay=kuberay.backend_for(executor))


def test_head_start_applies_the_raycluster_in_the_workload_namespace(handler, api):
    result = handler.run("ray.head.start", head_payload(), quiet)

    stored = api.get("rayclusters", NS, "train-6f1c2d3e")
    assert stored is not None
    assert stored["spec"]["workerGroupSpecs"][0]["maxReplicas"] == 4
    assert stored["metadata"]["annotations"][kuberay.MEMBER_ANNOTATION] == "head-1"
    assert result.container_id == "train-6f1c2d3e"
    assert result.hostname == "127.0.0.1"  # the head Service's IP, as KubeRay reports it
    assert result.existed is False
    assert api.namespaces[NS]["metadata"]["labels"][mf.MANAGED_BY_LABEL] == "cleverthis"
    assert any(c.method == "POST" and c.path.endswith("/rayclusters") and c.status == 201 for c in api.calls)


def test_head_start_again_finds_the_same_raycluster(handler, api):
    handler.run("ray.head.start", head_payload(), quiet)
    again = handler.run("ray.head.start", head_payload(member_id="head-2"), quiet)

    assert again.existed is True
    assert again.resumed is False
    assert api.names("rayclusters", NS) == ["train-6f1c2d3e"]
    assert (
        api.get("rayclusters", NS, "train-6f1c2d3e")["metadata"]["annotations"][kuberay.MEMBER_ANNOTATION] == "head-2"
    )


def test_stop_suspends_and_start_resumes_the_same_resource(handler, api):
    handler.run("ray.head.start", head_payload(), quiet)
    uid = api.get("rayclusters", NS, "train-6f1c2d3e")["metadata"]["uid"]

    stopped = handler.run("ray.node.stop", {"cluster_id": CLUSTER, "member_id": "head-1", "runtime": "kuberay"}, quiet)

    suspended = api.get("rayclusters", NS, "train-6f1c2d3e")
    assert stopped == protocol.RayNodeStopResult(stopped=True, suspended=True, container_id="train-6f1c2d3e")
    assert suspended["spec"]["suspend"] is True
    assert suspended["status"]["state"] == "suspended"
    status = handler.run("ray.status", {"cluster_id": CLUSTER, "member_id": "head-1", "runtime": "kuberay"}, quiet)
    assert status.kuberay.state == "suspended"
    assert status.nodes == []

    resumed = handler.run("ray.head.start", head_payload(member_id="head-2"), quiet)

    again = api.get("rayclusters", NS, "train-6f1c2d3e")
    assert resumed.resumed is True
    assert again["spec"]["suspend"] is False
    assert again["metadata"]["uid"] == uid


def test_delete_removes_the_raycluster_and_a_second_delete_is_fine(handler, api):
    handler.run("ray.head.start", head_payload(), quiet)
    stop = {"cluster_id": CLUSTER, "member_id": "head-1", "runtime": "kuberay", "delete": True}

    first = handler.run("ray.node.stop", stop, quiet)
    second = handler.run("ray.node.stop", stop, quiet)

    assert first.deleted is True
    assert first.stopped is True
    assert api.names("rayclusters", NS) == []
    assert second.stopped is False


def test_status_combines_the_resource_status_and_the_heads_ray_api(handler, api, head_api):
    handler.run("ray.head.start", head_payload(dashboard_port=head_api.port), quiet)

    status = handler.run("ray.status", {"cluster_id": CLUSTER, "member_id": "head-1", "runtime": "kuberay"}, quiet)

    assert status.kuberay.state == "ready"
    assert status.kuberay.ready_workers == 1
    assert (status.kuberay.min_workers, status.kuberay.max_workers) == (1, 4)
    assert status.kuberay.head_host == "127.0.0.1"
    head = next(n for n in status.nodes if n.is_head)
    worker = next(n for n in status.nodes if not n.is_head)
    assert head.member_id == "head-1"
    assert head.ray_node_id == "aa" * 28
    assert worker.resources["CPU"] == 2.0
    assert worker.member_id == ""
    assert any(path.startswith("/api/v0/nodes") for path in head_api.paths)


def test_status_reports_a_silent_head_without_failing(handler, api):
    handler.run("ray.head.start", head_payload(dashboard_port=1), quiet)

    status = handler.run("ray.status", {"cluster_id": CLUSTER, "member_id": "head-1", "runtime": "kuberay"}, quiet)

    assert status.kuberay.state == "ready"
    assert "does not answer" in status.kuberay.ray_api_error
    assert status.nodes == []


def test_proxy_targets_are_the_heads_service_hosts(handler, api):
    handler.run("ray.head.start", head_payload(), quiet)

    targets = handler.proxy_targets()

    assert ("127.0.0.1", 8265) in targets
    assert (kuberay.head_service_host("train-6f1c2d3e"), 8265) in targets
    assert ("127.0.0.1", 22) not in targets


def test_worker_start_and_drain_are_left_to_kuberay(handler):
    with pytest.raises(CommandFailed) as caught:
        handler.run(
            "ray.worker.start",
            {
                "cluster_id": CLUSTER,
                "member_id": "w",
                "ray_version": "2.60.0",
                "image": "x",
                "head_address": "h:1",
                "runtime": "kuberay",
            },
            quiet,
        )
    assert caught.value.code == "unsupported"


def test_without_the_crd_the_refusal_says_install_kuberay_not_404(tmp_path):
    api = K8sStandin(kuberay_installed=False).start()
    try:
        executor = KubernetesExecutor(kubeconfig_path=str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        handler = RayCommandHandler(kuberay=kuberay.backend_for(executor))
        with pytest.raises(CommandFailed) as caught:
            handler.run("ray.head.start", head_payload(), quiet)
        assert caught.value.code == "kuberay_missing"
        assert "install the KubeRay operator" in caught.value.message
        assert kuberay.INSTALL_URL in caught.value.message
        assert "404" not in caught.value.message
        assert "could not find" not in caught.value.message
        assert api.names("rayclusters", NS) == []
        with pytest.raises(CommandFailed) as on_status:
            handler.run("ray.status", {"cluster_id": CLUSTER, "member_id": "h", "runtime": "kuberay"}, quiet)
        assert on_status.value.code == "kuberay_missing"
    finally:
        api.stop()


def test_the_standin_refuses_a_raycluster_the_schema_refuses(api, tmp_path):
    import kubernetes
    from kubernetes.client.rest import ApiException

    executor = KubernetesExecutor(kubeconfig_path=str(api.write_kubeconfig(tmp_path / "kubeconfig")))
    executor._ensure_namespace()
    bad = kuberay.raycluster_manifest(start())
    bad["spec"]["workerGroupSpecs"][0]["minReplicas"] = 9
    with pytest.raises(ApiException) as caught:
        kubernetes.client.CustomObjectsApi(executor._client()).create_namespaced_custom_object(
            "ray.io", "v1", NS, "rayclusters", bad
        )
    assert caught.value.status == 422


def test_a_standalone_node_refuses_kuberay():
    with pytest.raises(CommandFailed) as caught:
        RayCommandHandler().run("ray.head.start", head_payload(), quiet)
    assert caught.value.code == "unsupported"


# ---- argocd mode


def git(bare: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(bare), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def bare(tmp_path: Path) -> Path:
    path = tmp_path / "gitops.git"
    subprocess.run(["git", "init", "--bare", "-q", str(path)], check=True)
    return path


@pytest.fixture
def argocd() -> Iterator[ArgoCDStandin]:
    standin = ArgoCDStandin().start()
    yield standin
    standin.stop()


@pytest.fixture
def gitops(bare: Path, argocd: ArgoCDStandin, tmp_path: Path) -> RayCommandHandler:
    executor = ArgoCDExecutor(
        repo_url=str(bare),
        branch=BRANCH,
        server=argocd.url,
        token=argocd.token,
        app_name="workloads",
        workdir=tmp_path / "agent",
    )
    return RayCommandHandler(kuberay=kuberay.backend_for(executor))


FILE = "manifests/raycluster-train-6f1c2d3e.yaml"


def test_argocd_commits_the_same_manifest_then_syncs(gitops, bare, argocd):
    result = gitops.run("ray.head.start", head_payload(), quiet)

    [committed] = mf.from_yaml(git(bare, "show", f"{BRANCH}:{FILE}"))
    assert committed == kuberay.raycluster_manifest(start())
    assert raycluster_schema.problems(committed) == []
    subject = git(bare, "log", "-1", "--format=%s", BRANCH).strip()
    assert subject == f"cleverthis: deploy ray cluster train-6f1c2d3e ({CLUSTER})"
    assert git(bare, "log", "-1", "--format=%an", BRANCH).strip() == "CleverThis Agent"
    assert [c.app for c in argocd.calls] == ["workloads"]
    assert argocd.calls[0].body == {"revision": BRANCH, "prune": True}
    assert result.container_id == "train-6f1c2d3e"
    assert result.hostname == kuberay.head_service_host("train-6f1c2d3e")
    assert result.commit == git(bare, "rev-parse", BRANCH).strip()


def test_argocd_stop_commits_suspend_start_unsuspends_and_delete_commits_the_removal(gitops, bare, argocd):
    gitops.run("ray.head.start", head_payload(), quiet)
    ref = {"cluster_id": CLUSTER, "member_id": "head-1", "runtime": "kuberay"}

    gitops.run("ray.node.stop", ref, quiet)
    [suspended] = mf.from_yaml(git(bare, "show", f"{BRANCH}:{FILE}"))
    assert suspended["spec"]["suspend"] is True
    assert (
        git(bare, "log", "-1", "--format=%s", BRANCH).strip()
        == f"cleverthis: stop ray cluster train-6f1c2d3e ({CLUSTER})"
    )

    resumed = gitops.run("ray.head.start", head_payload(member_id="head-2"), quiet)
    [running] = mf.from_yaml(git(bare, "show", f"{BRANCH}:{FILE}"))
    assert resumed.resumed is True
    assert running["spec"]["suspend"] is False
    assert (
        git(bare, "log", "-1", "--format=%s", BRANCH).strip()
        == f"cleverthis: start ray cluster train-6f1c2d3e ({CLUSTER})"
    )

    deleted = gitops.run("ray.node.stop", {**ref, "delete": True}, quiet)
    assert deleted.deleted is True
    assert FILE not in git(bare, "ls-tree", "-r", "--name-only", BRANCH).split()
    subject = git(bare, "log", "-1", "--format=%s", BRANCH).strip()
    assert subject == f"cleverthis: destroy ray cluster train-6f1c2d3e ({CLUSTER})"
    assert len(argocd.calls) == 4


def test_argocd_ray_manifests_are_not_reported_as_containers(gitops, bare, tmp_path, argocd):
    gitops.run("ray.head.start", head_payload(), quiet)

    assert gitops.kuberay.executor.list_containers() == []


def test_status_payload_and_stop_payload_accept_the_kuberay_runtime():
    assert parse_payload("ray.status", {"cluster_id": "c", "member_id": "m", "runtime": "kuberay"}).runtime == "kuberay"
    stop = parse_payload("ray.node.stop", {"cluster_id": "c", "member_id": "m", "runtime": "kuberay", "delete": True})
    assert isinstance(stop, RayNodeStopPayload)
    assert stop.delete is True
    assert isinstance(parse_payload("ray.status", {"cluster_id": "c", "member_id": "m"}), RayStatusPayload)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_status_reads_the_node_list_of_a_real_ray_head(tmp_path):
    """The head's state API as real Ray 2.60 answers it (a process head standing in for the head pod)."""
    from agent.ray.ports import free_port
    from agent.ray.process_runtime import RayProcessRuntime
    from tests.support.processes import VENV_BIN

    runtime = RayProcessRuntime(VENV_BIN / "ray", tmp_path / "ray")
    api = K8sStandin(ray_service_ip="127.0.0.1").start()
    try:
        head = runtime.start_head(gcs_port=free_port(), dashboard_port=free_port(), num_cpus=1)
        executor = KubernetesExecutor(kubeconfig_path=str(api.write_kubeconfig(tmp_path / "kubeconfig")))
        handler = RayCommandHandler(kuberay=kuberay.backend_for(executor))
        handler.run("ray.head.start", head_payload(dashboard_port=head.ports["dashboard"]), quiet)

        status = handler.run("ray.status", {"cluster_id": CLUSTER, "member_id": "head-1", "runtime": "kuberay"}, quiet)

        assert status.kuberay.ray_api_error is None
        [node] = status.nodes
        assert node.is_head is True
        assert node.ray_node_id == head.node_id
        assert node.member_id == "head-1"
        assert node.resources["CPU"] == 1.0
    finally:
        runtime.stop_all()
        api.stop()


def test_job_and_serve_calls_go_to_the_host_the_payload_names(head_api):
    """Job API and Serve calls reach a KubeRay head at its Service host, not the agent's own address."""
    from agent.ray.jobs import RayJobsHandler

    head_api.serve_applications = {"chat": {"status": "RUNNING", "deployments": {}}}
    jobs = RayJobsHandler(host="127.0.0.9")  # nothing listens there
    base = {"cluster_id": CLUSTER, "member_id": "head-1", "runtime": "kuberay", "dashboard_port": head_api.port}

    status = jobs.run("ray.serve.status", {**base, "host": "127.0.0.1"}, quiet)

    assert status.applications["chat"]["status"] == "RUNNING"
    assert "/api/serve/applications/" in head_api.paths
    with pytest.raises(CommandFailed):
        jobs.run("ray.serve.status", base, quiet)

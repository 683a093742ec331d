"""KubernetesExecutor with the official client against a loopback Kubernetes API stand-in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.errors import CommandFailed
from agent.executors import manifests as mf
from agent.executors.kubernetes import KubernetesExecutor, resolve_kubeconfig
from agent.protocol import ContainerCreatePayload, ContainerRefPayload, PortMapping
from tests.support.k8s_standin import K8sStandin
from tests.support.processes import free_port

NS = mf.NAMESPACE


def quiet(*_args: object, **_kwargs: object) -> None:
    """A ProgressFn that ignores its calls."""


@pytest.fixture
def api() -> Iterator[K8sStandin]:
    standin = K8sStandin().start()
    yield standin
    standin.stop()


@pytest.fixture
def executor(api: K8sStandin, tmp_path: Path) -> KubernetesExecutor:
    return KubernetesExecutor(kubeconfig_path=str(api.write_kubeconfig(tmp_path / "kubeconfig")))


def web(**overrides: object) -> ContainerCreatePayload:
    values: dict = {
        "image": "nginx:1.27",
        "name": "Web_App",
        "command": ["nginx", "-g", "daemon off;"],
        "env": {"MODE": "prod"},
        "ports": [PortMapping(container_port=8080), PortMapping(container_port=9090)],
        "cpu": 1.5,
        "memory_mb": 512,
        "gpus": 1,
        "labels": {"team": "ml"},
    }
    values.update(overrides)
    return ContainerCreatePayload(**values)


def test_create_applies_deployment_service_and_ingress_in_our_namespace(executor, api):
    result = executor.execute(
        "container.create", web(endpoint_host="web.example.test"), command_key="key-1", progress=quiet
    )

    assert result.container_id == mf.workload_id("key-1")
    assert result.name == "web-app"
    assert result.status == "running"
    assert api.namespaces[NS]["metadata"]["labels"][mf.MANAGED_BY_LABEL] == "cleverthis"
    deployment = api.get("deployments", NS, "web-app")
    assert deployment["metadata"]["labels"][mf.MANAGED_BY_LABEL] == "cleverthis"
    assert deployment["metadata"]["labels"]["team"] == "ml"
    assert deployment["metadata"]["annotations"][mf.COMMAND_KEY_ANNOTATION] == "key-1"
    assert deployment["spec"]["replicas"] == 1
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "nginx:1.27"
    assert container["args"] == ["nginx", "-g", "daemon off;"]
    assert container["env"] == [{"name": "MODE", "value": "prod"}]
    assert container["resources"]["limits"] == {"cpu": "1500m", "memory": "512Mi", "nvidia.com/gpu": "1"}
    service = api.get("services", NS, "web-app")
    assert service["spec"]["type"] == "ClusterIP"
    assert [p["port"] for p in service["spec"]["ports"]] == [8080]
    assert service["spec"]["selector"] == {mf.WORKLOAD_LABEL: result.container_id}
    ingress = api.get("ingresses", NS, "web-app")
    rule = ingress["spec"]["rules"][0]
    assert rule["host"] == "web.example.test"
    assert rule["http"]["paths"][0]["backend"]["service"] == {"name": "web-app", "port": {"number": 8080}}


def test_no_ingress_without_endpoint_host_and_no_service_without_ports(executor, api):
    executor.execute("container.create", web(name="svc-only"), command_key="a", progress=quiet)
    executor.execute("container.create", web(name="bare", ports=[]), command_key="b", progress=quiet)
    assert api.names("services", NS) == ["svc-only"]
    assert api.names("ingresses", NS) == []
    assert api.names("deployments", NS) == ["bare", "svc-only"]


def test_create_is_idempotent_on_the_command_key(executor, api):
    first = executor.execute("container.create", web(), command_key="same", progress=quiet)
    again = executor.execute("container.create", web(name="other-name"), command_key="same", progress=quiet)
    assert again.container_id == first.container_id
    assert again.existed is True
    assert api.names("deployments", NS) == ["web-app"]
    creates = [c for c in api.calls if c.method == "POST" and c.path.endswith("/deployments")]
    assert len(creates) == 1


def test_same_name_from_another_key_is_a_conflict(executor):
    executor.execute("container.create", web(), command_key="k1", progress=quiet)
    with pytest.raises(CommandFailed) as err:
        executor.execute("container.create", web(), command_key="k2", progress=quiet)
    assert err.value.code == "conflict"


def test_stop_scales_to_zero_start_to_one_destroy_deletes_everything(executor, api):
    created = executor.execute("container.create", web(endpoint_host="h.test"), command_key="life", progress=quiet)
    by_id = ContainerRefPayload(container=created.container_id)

    assert executor.execute("container.stop", by_id, command_key="s", progress=quiet).status == "stopped"
    assert api.get("deployments", NS, "web-app")["spec"]["replicas"] == 0
    assert [c.status for c in executor.list_containers()] == ["stopped"]
    by_name = ContainerRefPayload(container="web-app")
    assert executor.execute("container.start", by_name, command_key="t", progress=quiet).status == "running"
    assert api.get("deployments", NS, "web-app")["spec"]["replicas"] == 1

    assert executor.execute("container.destroy", by_id, command_key="d", progress=quiet).status == "missing"
    assert api.names("deployments", NS) == []
    assert api.names("services", NS) == []
    assert api.names("ingresses", NS) == []
    assert executor.execute("container.destroy", by_id, command_key="d2", progress=quiet).status == "missing"
    with pytest.raises(CommandFailed) as err:
        executor.execute("container.start", by_id, command_key="t2", progress=quiet)
    assert err.value.code == "not_found"


def test_list_containers_reports_only_managed_deployments(executor, api):
    assert executor.list_containers() == []  # namespace not created yet
    executor.execute("container.create", web(), command_key="ours", progress=quiet)
    foreign = {
        "metadata": {"name": "foreign", "labels": {"app": "x"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "x"}},
            "template": {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "x", "image": "x"}]}},
        },
    }
    api._route("POST", f"/apis/apps/v1/namespaces/{NS}/deployments", foreign, {})

    [info] = executor.list_containers()
    assert info.container_id == mf.workload_id("ours")
    assert info.command_key == "ours"
    assert info.image == "nginx:1.27"
    with pytest.raises(CommandFailed) as err:
        executor.execute("container.destroy", ContainerRefPayload(container="foreign"), command_key="x", progress=quiet)
    assert err.value.code == "not_found"
    assert api.get("deployments", NS, "foreign") is not None


def test_wrong_token_and_unreachable_server_are_kubernetes_unavailable(api, tmp_path):
    bad_token = KubernetesExecutor(kubeconfig_path=str(api.write_kubeconfig(tmp_path / "kc", token="wrong")))
    with pytest.raises(CommandFailed) as err:
        bad_token.execute("container.create", web(), command_key="k", progress=quiet)
    assert err.value.code == "kubernetes_unavailable"

    (tmp_path / "dead").write_text((tmp_path / "kc").read_text().replace(api.url, f"http://127.0.0.1:{free_port()}"))
    dead = KubernetesExecutor(kubeconfig_path=str(tmp_path / "dead"))
    with pytest.raises(CommandFailed) as err:
        dead.list_containers()
    assert err.value.code == "kubernetes_unavailable"

    missing = KubernetesExecutor(kubeconfig_path=str(tmp_path / "nope"))
    with pytest.raises(CommandFailed) as err:
        missing.list_containers()
    assert err.value.code == "kubernetes_unavailable"


def test_kubeconfig_resolution_order(tmp_path):
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    assert resolve_kubeconfig({}, home) is None
    (home / ".kube" / "config").write_text("{}")
    assert resolve_kubeconfig({}, home) == home / ".kube" / "config"
    env = {"KUBECONFIG": "/etc/k/a.yaml:/etc/k/b.yaml"}
    assert resolve_kubeconfig(env, home) == Path("/etc/k/a.yaml")
    env["CLEVERTHIS_KUBECONFIG"] = "/srv/cleverthis/kubeconfig"
    assert resolve_kubeconfig(env, home) == Path("/srv/cleverthis/kubeconfig")


def test_workload_ids_are_stable_and_label_safe():
    assert mf.workload_id("abc") == mf.workload_id("abc")
    assert mf.workload_id("abc") != mf.workload_id("abd")
    assert len(mf.workload_id("x" * 500)) <= 63
    assert mf.resource_name("My App!! v2") == "my-app-v2"
    with pytest.raises(ValueError, match="Kubernetes name"):
        mf.resource_name("!!!")


def test_registry_credentials_become_an_image_pull_secret(executor, api):
    import base64
    import json

    spec = web(image="registry.example.test:5000/team/app:1", registry_username="robot", registry_password="pw")
    created = executor.execute("container.create", spec, command_key="private", progress=quiet)

    secret = api.get("secrets", NS, "web-app-registry")
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    entry = config["auths"]["registry.example.test:5000"]
    assert (entry["username"], entry["password"]) == ("robot", "pw")
    assert base64.b64decode(entry["auth"]) == b"robot:pw"
    pod = api.get("deployments", NS, "web-app")["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "web-app-registry"}]

    executor.execute(
        "container.destroy", ContainerRefPayload(container=created.container_id), command_key="d", progress=quiet
    )
    assert api.names("secrets", NS) == []


@pytest.mark.parametrize(
    ("image", "host"),
    [
        ("nginx", "https://index.docker.io/v1/"),
        ("library/nginx:1", "https://index.docker.io/v1/"),
        ("ghcr.io/a/b:1", "ghcr.io"),
        ("localhost/x", "localhost"),
        ("127.0.0.1:5000/x", "127.0.0.1:5000"),
    ],
)
def test_registry_host(image, host):
    assert mf.registry_host(image) == host

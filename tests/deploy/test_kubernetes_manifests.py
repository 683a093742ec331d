"""deploy/kubernetes: every object valid against the official Kubernetes schemas (kubernetes-validate,
strict: an unknown field fails), and the shape the control plane needs (several web replicas with an
autoscaler, one beat that never overlaps, the migrate Job, the wildcard node-origin hosts in the Ingress)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from tests.support.k8s_schema import KUBERNETES_VERSION

MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
ENTRYPOINT_COMMANDS = {"web", "worker", "beat", "migrate"}


def documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        found += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def objects() -> dict[tuple[str, str], dict[str, Any]]:
    return {(doc["kind"], doc["metadata"]["name"]): doc for _, doc in documents() if doc["kind"] != "Kustomization"}


def pod_specs() -> list[dict[str, Any]]:
    return [obj["spec"]["template"]["spec"] for (kind, _), obj in objects().items() if kind in ("Deployment", "Job")]


@pytest.mark.parametrize(
    "doc",
    [doc for _, doc in documents() if doc["kind"] != "Kustomization"],
    ids=[f"{name}:{doc['kind']}" for name, doc in documents() if doc["kind"] != "Kustomization"],
)
def test_every_object_is_valid_against_the_official_schema_strictly(doc):
    assert kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_strict_validation_refuses_an_unknown_field():
    web = copy.deepcopy(objects()[("Deployment", "cleverthis-web")])
    web["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError, match="imagePullPolicyy"):
        kubernetes_validate.validate(web, KUBERNETES_VERSION, strict=True)


def test_kustomization_applies_every_manifest_but_the_secret_template():
    kustomization = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    expected = {p.name for p in MANIFESTS.glob("*.yaml")} - {"kustomization.yaml", "secret.example.yaml"}
    assert set(kustomization["resources"]) == expected


def test_web_runs_several_replicas_rolling_and_autoscaled():
    found = objects()
    web = found[("Deployment", "cleverthis-web")]
    assert web["spec"]["replicas"] >= 2
    assert web["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    hpa = found[("HorizontalPodAutoscaler", "cleverthis-web")]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "cleverthis-web"}
    assert hpa["spec"]["minReplicas"] >= 2
    assert hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    service = found[("Service", "cleverthis-web")]
    pod_labels = web["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert web["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_web_pods_reach_each_other_for_peer_links_at_the_pod_ip_on_a_declared_port():
    """A proxied request on one pod opens its stream at the pod holding the tunnel: each pod listens on
    every interface, advertises its own IP (downward API) and declares the fixed peer port."""
    (container,) = objects()[("Deployment", "cleverthis-web")]["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item for item in container["env"]}
    assert env["TUNNEL_PEER_BIND"]["value"] == "0.0.0.0"
    assert env["TUNNEL_PEER_ADVERTISE"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports["peer"] == int(env["TUNNEL_PEER_PORT"]["value"])
    assert ports["peer"] != ports["http"]


def test_exactly_one_beat_that_never_overlaps_and_a_worker():
    found = objects()
    beat = found[("Deployment", "cleverthis-beat")]
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    assert "HorizontalPodAutoscaler" not in {kind for kind, name in found if name == "cleverthis-beat"}
    assert found[("Deployment", "cleverthis-worker")]["spec"]["template"]["spec"]["containers"][0]["args"] == ["worker"]
    assert found[("Job", "cleverthis-migrate")]["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]


def test_ingress_serves_the_control_plane_and_the_wildcard_node_origins_over_tls():
    found = objects()
    config = found[("ConfigMap", "cleverthis-config")]["data"]
    ingress = found[("Ingress", "cleverthis")]
    hosts = {rule["host"] for rule in ingress["spec"]["rules"]}
    assert hosts == {
        urlsplit(config["CONTROL_PLANE_URL"]).hostname,
        "*." + config["ENDPOINT_DOMAIN"],
        "*." + config["RAY_DASHBOARD_DOMAIN"],
    }
    assert hosts <= {host for tls in ingress["spec"]["tls"] for host in tls["hosts"]}
    backends = {p["backend"]["service"]["name"] for r in ingress["spec"]["rules"] for p in r["http"]["paths"]}
    assert backends == {"cleverthis-web"}
    assert config["HTTPS_COOKIES"] == "1"
    assert config["NODE_ORIGIN_SCHEME"] == "https"


def test_every_process_runs_the_image_non_root_with_the_shared_config():
    found = objects()
    for spec in pod_specs():
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        for container in spec["containers"]:
            assert container["image"].startswith("localhost/cleverthis-control-plane:")
            assert container["args"][0] in ENTRYPOINT_COMMANDS
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            refs = {(next(iter(ref)), next(iter(ref.values()))["name"]) for ref in container["envFrom"]}
            assert refs == {("configMapRef", "cleverthis-config"), ("secretRef", "cleverthis-secrets")}
            assert ("ConfigMap", "cleverthis-config") in found
            assert ("Secret", "cleverthis-secrets") in found


def test_web_believes_forwarded_headers_from_the_ingress_pods_only():
    from kernel.client_address import check_trusted_proxies

    trusted = objects()[("ConfigMap", "cleverthis-config")]["data"]["TRUSTED_PROXIES"]
    entries = [entry.strip() for entry in trusted.split(",")]
    assert entries
    assert check_trusted_proxies(entries) == []


def test_peer_ports_admit_only_web_pods_while_http_stays_open():
    """The NetworkPolicy selects the web pods, lets HTTP in from anywhere, and the peer-link ports (each web
    process of a pod takes the next one from TUNNEL_PEER_PORT) only from web pods; nothing else gets in."""
    found = objects()
    web = found[("Deployment", "cleverthis-web")]
    web_labels = web["spec"]["template"]["metadata"]["labels"]
    (container,) = web["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item for item in container["env"]}
    first_peer = int(env["TUNNEL_PEER_PORT"]["value"])
    processes = int(found[("ConfigMap", "cleverthis-config")]["data"]["WEB_CONCURRENCY"])
    policy = found[("NetworkPolicy", "cleverthis-web")]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= web_labels.items()
    assert policy["policyTypes"] == ["Ingress"]  # ingress not listed below is refused
    by_port: dict[Any, list[dict[str, Any]]] = {}
    for rule in policy["ingress"]:
        for port in rule["ports"]:
            by_port[port["port"]] = rule.get("from", [])
            if port["port"] == first_peer:
                assert port["endPort"] >= first_peer + processes - 1
    assert by_port["http"] == []  # from anywhere: the ingress controller
    assert set(by_port) == {"http", first_peer}
    (source,) = by_port[first_peer]
    assert set(source) == {"podSelector"}  # this namespace's pods, and only those labelled web
    assert source["podSelector"]["matchLabels"].items() <= web_labels.items()
    assert source["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "web"


def test_web_pods_leave_the_service_and_drain_before_they_stop():
    """docs/deploy.md (Upgrades): one pod more before one less, at most one evicted at a time, readiness
    on /healthz (503 while draining), a preStop pause for the endpoints to drop the pod, and a grace
    period longer than that pause plus the drain and uvicorn's graceful shutdown."""
    found = objects()
    web = found[("Deployment", "cleverthis-web")]
    assert web["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    pod = web["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    readiness = container["readinessProbe"]
    drain_lb_s = float(found[("ConfigMap", "cleverthis-config")]["data"]["WEB_DRAIN_LB_S"])
    assert readiness["periodSeconds"] * readiness["failureThreshold"] <= drain_lb_s + 1
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    deadline = float(found[("ConfigMap", "cleverthis-config")]["data"]["WEB_DRAIN_DEADLINE_S"])
    assert pod["terminationGracePeriodSeconds"] > float(pre_stop[1]) + 2 * deadline
    budget = found[("PodDisruptionBudget", "cleverthis-web")]
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= web["spec"]["template"]["metadata"]["labels"].items()

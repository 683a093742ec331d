"""The kube stand-in refuses what the API server would: objects checked against the official schemas.

Raw HTTP, not the kubernetes client: the client checks its own models before sending, and what is
tested here is the stand-in's answer to whatever reaches it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import requests

from tests.support.k8s_standin import K8sStandin

DEPLOYMENTS = "/apis/apps/v1/namespaces/team/deployments"
Call = Callable[..., requests.Response]


@pytest.fixture
def standin() -> Iterator[K8sStandin]:
    api = K8sStandin().start()
    yield api
    api.stop()


@pytest.fixture
def call(standin: K8sStandin) -> Call:
    def send(method: str, path: str, body: object, content_type: str = "application/json") -> requests.Response:
        headers = {"Authorization": f"Bearer {standin.token}", "Content-Type": content_type}
        return requests.request(method, standin.url + path, json=body, headers=headers, timeout=10)

    assert send("POST", "/api/v1/namespaces", {"metadata": {"name": "team"}}).status_code == 201
    return send


def deployment(**container: object) -> dict:
    return {
        "metadata": {"name": "web"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx:1.27", **container}]},
            },
        },
    }


def test_a_valid_deployment_is_stored(call, standin):
    assert call("POST", DEPLOYMENTS, deployment(ports=[{"containerPort": 80}])).status_code == 201
    assert standin.get("deployments", "team", "web")["spec"]["template"]["spec"]["containers"][0]["ports"]


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ({"imagePullPolicyy": "Always"}, "'imagePullPolicyy' was unexpected"),
        ({"ports": [{"containerPort": "eighty"}]}, "'eighty' is not of type 'integer'"),
    ],
)
def test_unknown_fields_and_wrong_types_are_refused_with_422(call, standin, field, expected):
    refused = call("POST", DEPLOYMENTS, deployment(**field))
    assert refused.status_code == 422
    assert refused.json()["reason"] == "Invalid"
    assert expected in refused.json()["message"]
    assert standin.get("deployments", "team", "web") is None


def test_a_replace_or_patch_that_breaks_the_schema_is_refused(call, standin):
    assert call("POST", DEPLOYMENTS, deployment()).status_code == 201
    broken = {**deployment(), "spec": {**deployment()["spec"], "replica": 2}}
    assert call("PUT", f"{DEPLOYMENTS}/web", broken).status_code == 422
    patch = call("PATCH", f"{DEPLOYMENTS}/web", {"spec": {"replicas": "two"}}, "application/merge-patch+json")
    assert patch.status_code == 422
    assert standin.get("deployments", "team", "web")["spec"].get("replicas") is None


def test_services_ingresses_secrets_and_namespaces_are_checked_too(call):
    service = {"metadata": {"name": "s"}, "spec": {"portz": []}}
    assert call("POST", "/api/v1/namespaces/team/services", service).status_code == 422
    ingress = {"metadata": {"name": "i"}, "spec": {"rules": [{"host": 7}]}}
    assert call("POST", "/apis/networking.k8s.io/v1/namespaces/team/ingresses", ingress).status_code == 422
    assert call("POST", "/api/v1/namespaces/team/secrets", {"metadata": {"name": "x"}, "data": "no"}).status_code == 422
    assert call("POST", "/api/v1/namespaces", {"metadata": {"name": "other", "labelz": {}}}).status_code == 422

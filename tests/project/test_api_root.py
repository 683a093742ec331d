"""The browsable API root /api/v1/ lists every top-level resource, and each link answers."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db

RESOURCES = {
    "workspaces": "/api/v1/workspaces/",
    "clusters": "/api/v1/clusters/",
    "nodes": "/api/v1/nodes/",
    "commands": "/api/v1/commands/",
    "namespaces": "/api/v1/namespaces/",
    "containers": "/api/v1/containers/",
    "models": "/api/v1/models/",
    "catalog": "/api/v1/catalog/",
    "model-caches": "/api/v1/model-caches/",
    "endpoints": "/api/v1/endpoints/",
    "ray-clusters": "/api/v1/ray/clusters/",
    "training-jobs": "/api/v1/ray/training-jobs/",
    "tune-experiments": "/api/v1/ray/tune-experiments/",
    "deployments": "/api/v1/ray/deployments/",
    "audit": "/api/v1/audit/",
    "api-keys": "/api/v1/api-keys/",
    "usage": "/api/v1/usage/",
    "prices": "/api/v1/prices/",
    "budgets": "/api/v1/budgets/",
}


def test_the_api_root_lists_every_top_level_resource(api_client_for, owner, workspace):
    api = api_client_for(owner)
    root = api.get("/api/v1/")
    assert root.status_code == 200
    listed = root.json()
    assert {name: url.removeprefix("http://testserver") for name, url in listed.items()} == RESOURCES
    for url in RESOURCES.values():
        assert api.get(url).status_code == 200, url
    browsable = api.get("/api/v1/", HTTP_ACCEPT="text/html")
    assert browsable.status_code == 200
    assert b"/api/v1/ray/training-jobs/" in browsable.content

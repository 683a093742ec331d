"""The model catalog and the model cache end to end, on a real agent downloading from the loopback Hub.

- A private catalog model is deployed from the Models page: its Deploy link pre-fills the cluster's endpoint
  form, which starts the endpoint on the node holding the weights (the agent runs the OpenAI stand-in with the
  arguments it would give vLLM), and the start's event says it was placed there for the weights.
- The node's cache budget travels with the next downloads; once the cache passes it, the agent evicts the least
  recently used snapshot no endpoint serves (its files go), the control plane records it, and the inventory
  reports each snapshot's last use and the disk free.
- Evicting from the API is refused while the endpoint serves from the snapshot, and done once it stopped.
"""

from __future__ import annotations

import re
import sys
from html import unescape
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from fleet import services
from fleet.models import Command, NodeEvent
from fleet.workloads import services as workloads
from fleet.workloads.models import Endpoint, EndpointEvent, NodeCache, NodeModel
from tests.e2e.conftest import node_of, wait_status
from tests.support.processes import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
KIB = 1024


def _finished(command: Command, timeout: float = 60) -> Command:
    wait_until(
        lambda: Command.objects.get(pk=command.pk).status in ("succeeded", "failed"), timeout=timeout, what="command"
    )
    command.refresh_from_db()
    return command


def _download(user, cluster, node, model_id: str) -> Command:
    (command,) = services.command_dispatch(
        actor=user, cluster=cluster, command_type="model.download", payload={"model_id": model_id}, node=node
    )
    command = _finished(command)
    assert command.status == "succeeded", (command.error_code, command.error_message)
    return command


def _cached(node) -> set[str]:
    return set(NodeModel.objects.filter(node=node).values_list("model_id", flat=True))


def test_catalog_deploy_then_budget_eviction_and_evict(control_plane, cluster, operator, agents, hub, client):
    user, workspace = operator
    for name in ("acme/older", "acme/newer", "acme/latest"):
        hub.add_repo(name, {"config.json": b"{}", "weights.bin": name.encode()[:1] * (400 * KIB)})
    server = f"{sys.executable} -m tests.support.openai_standin"
    _, state, env = agents(control_plane, cluster, user, "cache", extra_env={"CLEVERTHIS_ENDPOINT_SERVER": server})
    node = node_of(state)
    wait_status(node, "online")
    cache_root = Path(env["CLEVERTHIS_MODEL_CACHE"])
    _download(user, cluster, node, "acme/older")
    _download(user, cluster, node, "acme/tiny")
    wait_until(lambda: NodeCache.objects.filter(node=node, disk_free_bytes__gt=0).exists(), timeout=30, what="disk")

    # the catalog: a private model of the workspace, deployed from the Models page
    api = APIClient()
    api.force_authenticate(user=user)
    made = api.post(
        "/api/v1/catalog/",
        {
            "workspace": str(workspace.pk),
            "name": "tiny",
            "model_id": "acme/tiny",
            "params_b": 0.001,
            "server_args": ["--max-model-len", "256"],
        },
        format="json",
    )
    assert made.status_code == 201, made.content
    client.force_login(user)
    page = client.get("/compute/models/", {"search": "tiny", "context": "256"}).content.decode()
    assert "holds the weights" in page
    deploy = unescape(re.search(r'href="([^"]*/endpoints/\?model_id=acme%2Ftiny[^"]*)"', page).group(1))
    form = client.get(deploy).content.decode()
    assert '<option value="acme/tiny" selected>' in form
    assert 'value="--max-model-len 256"' in form
    fields = {
        "model_id": "acme/tiny",
        "revision": "main",
        "gpus": "0",
        "min_vram_mb": "0",
        "min_replicas": "1",
        "idle_timeout_s": "300",
        "server_args": "--max-model-len 256",
    }
    posted = client.post(deploy.split("?")[0] + "new/", fields)
    assert posted.status_code == 302, posted.content.decode()[-2000:]
    endpoint = Endpoint.objects.get(model_id="acme/tiny")
    wait_until(lambda: Endpoint.objects.get(pk=endpoint.pk).status in ("running", "failed"), timeout=60, what="up")
    endpoint.refresh_from_db()
    assert endpoint.status == "running", endpoint.failure_message
    assert endpoint.server_args == ["--max-model-len", "256"]
    started = EndpointEvent.objects.get(endpoint=endpoint, kind="endpoint.starting")
    assert f"placed on node {node.name}, which holds the weights in its model cache" in started.message

    # a budget of 1 MiB: three snapshots of ~400 KiB fit no more; the fourth evicts the least recently used
    answer = api.post(f"/api/v1/model-caches/{node.pk}/budget/", {"budget_mb": 1}, format="json")
    assert answer.status_code == 200, answer.content
    newer = _download(user, cluster, node, "acme/newer")
    assert newer.payload["cache_budget_bytes"] == 1024 * KIB
    assert newer.result.get("evicted") is None
    latest = _download(user, cluster, node, "acme/latest")
    assert latest.result["evicted"] == ["acme/older@main"]
    wait_until(lambda: "acme/older" not in _cached(node), timeout=30, what="eviction recorded")
    assert _cached(node) == {"acme/tiny", "acme/newer", "acme/latest"}
    assert not (cache_root / "models--acme--older").exists()
    assert NodeEvent.objects.filter(node=node, message__contains="the cache budget evicted acme/older@main").exists()
    wait_until(lambda: NodeCache.objects.get(node=node).reported_budget_bytes == 1024 * KIB, timeout=30, what="budget")
    tiny = NodeModel.objects.get(node=node, model_id="acme/tiny")
    assert tiny.last_used_at is not None
    assert tiny.last_used_at >= endpoint.created_at  # the endpoint's start used it

    # evict: refused while the endpoint serves from it, done once it stopped
    refused = api.post(f"/api/v1/models/{tiny.pk}/evict/")
    assert refused.status_code == 409, refused.content
    workloads.endpoint_stop(actor=user, endpoint=endpoint)
    wait_until(lambda: Endpoint.objects.get(pk=endpoint.pk).status == "stopped", timeout=60, what="stopped")
    evicting = api.post(f"/api/v1/models/{tiny.pk}/evict/")
    assert evicting.status_code == 202, evicting.content
    evict = _finished(Command.objects.get(pk=evicting.json()["command"]))
    assert evict.status == "succeeded", evict.error_message
    assert evict.result["evicted"] is True
    assert evict.result["freed_bytes"] == tiny.size_bytes
    assert not NodeModel.objects.filter(pk=tiny.pk).exists()
    assert not (cache_root / "models--acme--tiny").exists()


def test_a_private_model_in_a_folder_on_the_node_is_registered_then_served(
    control_plane, cluster, operator, agents, tmp_path, client
):
    user, workspace = operator
    folder = tmp_path / "srv" / "house-llm"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"layers": 1}')
    (folder / "weights.bin").write_bytes(b"h" * 4096)
    server = f"{sys.executable} -m tests.support.openai_standin"
    _, state, env = agents(control_plane, cluster, user, "local", extra_env={"CLEVERTHIS_ENDPOINT_SERVER": server})
    node = node_of(state)
    wait_status(node, "online")
    api = APIClient()
    api.force_authenticate(user=user)
    made = api.post(
        "/api/v1/catalog/",
        {"workspace": str(workspace.pk), "name": "house", "local_path": str(folder), "params_b": 0.001},
        format="json",
    )
    assert made.status_code == 201, made.content
    served_as = made.json()["model_id"]
    assert served_as == "local/house-llm"
    client.force_login(user)
    page = client.get("/compute/models/", {"search": "house"}).content.decode()
    assert f"local_path={folder}" in page  # how to register it

    (register,) = services.command_dispatch(
        actor=user,
        cluster=cluster,
        command_type="model.download",
        payload={"model_id": served_as, "local_path": str(folder)},
        node=node,
    )
    register = _finished(register)
    assert register.status == "succeeded", register.error_message
    assert register.result["size_bytes"] == 4096 + len('{"layers": 1}')
    wait_until(lambda: served_as in _cached(node), timeout=30, what="registered")
    assert "holds the weights" in client.get("/compute/models/", {"search": "house"}).content.decode()

    created = api.post("/api/v1/endpoints/", {"cluster": str(cluster.pk), "model_id": served_as}, format="json")
    assert created.status_code == 201, created.content
    endpoint = Endpoint.objects.get(pk=created.json()["id"])
    wait_until(lambda: Endpoint.objects.get(pk=endpoint.pk).status in ("running", "failed"), timeout=60, what="up")
    endpoint.refresh_from_db()
    assert endpoint.status == "running", endpoint.failure_message
    link = Path(env["CLEVERTHIS_MODEL_CACHE"]) / "models--local--house-llm" / "snapshots" / "local"
    assert link.resolve() == folder.resolve()
    workloads.endpoint_stop(actor=user, endpoint=endpoint)
    wait_until(lambda: Endpoint.objects.get(pk=endpoint.pk).status == "stopped", timeout=60, what="stopped")

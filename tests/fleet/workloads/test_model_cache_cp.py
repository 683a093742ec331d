"""Nodes' model caches on the control plane: what the agent reports (last use, disk free, budget), eviction from
the API and the page (refused while an endpoint serves from it, Owner/Admin only), the budget sent with each
download, what the budget evicted, download progress with bytes and rate on the page (polled while it runs),
and placement saying it took the node holding the weights."""

from __future__ import annotations

import time

import pytest

from agent import protocol
from fleet import services
from fleet.models import Command, NodeEvent
from fleet.workloads import services as workloads
from fleet.workloads.models import EndpointEvent, NodeCache, NodeModel
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db
MIB = 1024 * 1024
HX = {"HTTP_HX_REQUEST": "true"}


def cached(model_id: str, *, used: float = 0.0, size: int = 10 * MIB) -> protocol.CachedModel:
    return protocol.CachedModel(
        model_id=model_id, revision="main", path=f"/c/{model_id}", size_bytes=size, last_used_at=used
    )


def report(node, *models, disk_free=50 * 1024 * MIB, budget=0):
    inv = protocol.Inventory(models=list(models), disk_free_bytes=disk_free, cache_budget_bytes=budget)
    services.node_record_inventory(node=node, inventory=inv)


@pytest.fixture
def node(cluster, register_node):
    return register_node(cluster, "gpu-1")


def test_the_inventory_fills_last_use_disk_free_and_the_applied_budget(node, owner, api_client_for):
    used = time.time() - 3600
    report(node, cached("acme/a", used=used), cached("acme/b"), budget=300 * MIB)
    row = NodeModel.objects.get(node=node, model_id="acme/a")
    assert abs(row.last_used_at.timestamp() - used) < 1
    assert NodeModel.objects.get(node=node, model_id="acme/b").last_used_at is None

    answer = api_client_for(owner).get(f"/api/v1/model-caches/{node.pk}/")
    assert answer.status_code == 200
    body = answer.json()
    assert body["disk_free_bytes"] == 50 * 1024 * MIB
    assert body["reported_budget_bytes"] == 300 * MIB
    assert body["used_bytes"] == 20 * MIB
    assert [m["model_id"] for m in body["models"]] == ["acme/a", "acme/b"]
    assert body["models"][0]["last_used_at"] is not None


def test_evict_through_the_api_queues_model_evict_and_the_result_removes_the_row(node, owner, api_client_for):
    report(node, cached("acme/a"))
    row = NodeModel.objects.get(node=node)
    answer = api_client_for(owner).post(f"/api/v1/models/{row.pk}/evict/")
    assert answer.status_code == 202, answer.content
    command = Command.objects.get(pk=answer.json()["command"])
    assert (command.command_type, command.payload) == ("model.evict", {"model_id": "acme/a", "revision": "main"})
    agent_side.result(command, model_id="acme/a", revision="main", evicted=True, freed_bytes=10 * MIB)
    assert not NodeModel.objects.filter(pk=row.pk).exists()
    assert NodeEvent.objects.filter(node=node, kind="model.evicted", message__contains="10 MiB freed").exists()


def test_evict_is_refused_while_an_endpoint_serves_from_it(node, cluster, owner, api_client_for, member_of, workspace):
    report(node, cached("acme/a"))
    workloads.endpoint_create(actor=owner, cluster=cluster, model_id="acme/a")
    row = NodeModel.objects.get(node=node)
    client = api_client_for(owner)
    refused = client.post(f"/api/v1/models/{row.pk}/evict/")
    assert refused.status_code == 409
    assert "in use" in refused.json()["detail"]
    # the generic command API refuses it too
    generic = client.post(
        f"/api/v1/clusters/{cluster.pk}/commands",
        {
            "node_id": str(node.pk),
            "command_type": "model.evict",
            "payload": {"model_id": "acme/a"},
        },
        format="json",
    )
    assert generic.status_code == 400, generic.content
    assert not Command.objects.filter(command_type="model.evict").exists()
    member = api_client_for(member_of(workspace, "member"))
    assert member.post(f"/api/v1/models/{row.pk}/evict/").status_code == 403


def test_the_budget_travels_with_each_download_and_its_evictions_are_recorded(node, cluster, owner, api_client_for):
    client = api_client_for(owner)
    bad = client.post(f"/api/v1/model-caches/{node.pk}/budget/", {"budget_mb": -1}, format="json")
    assert bad.status_code == 400
    assert client.post(f"/api/v1/model-caches/{node.pk}/budget/", {"budget_mb": 512}, format="json").status_code == 200
    assert NodeCache.objects.get(node=node).budget_mb == 512
    report(node, cached("acme/old"), cached("acme/kept"))

    (download,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="model.download", payload={"model_id": "acme/new"}, node=node
    )
    download.refresh_from_db()
    assert download.payload["cache_budget_bytes"] == 512 * MIB
    agent_side.result(
        download, model_id="acme/new", revision="main", path="/c/new", size_bytes=5, evicted=["acme/old@main"]
    )
    assert set(NodeModel.objects.filter(node=node).values_list("model_id", flat=True)) == {"acme/kept", "acme/new"}
    event = NodeEvent.objects.get(node=node, kind="model.downloaded")
    assert "the cache budget evicted acme/old@main (least recently used)" in event.message


def test_an_agent_older_than_the_cache_protocol_gets_no_budget(node, cluster, owner):
    workloads.node_cache_set_budget(actor=owner, node=node, budget_mb=100)
    type(node).objects.filter(pk=node.pk).update(protocol_version=protocol.MODEL_CACHE_SINCE - 1)
    (download,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="model.download", payload={"model_id": "acme/new"}, node=node
    )
    download.refresh_from_db()
    assert "cache_budget_bytes" not in download.payload


def test_the_node_page_shows_progress_with_bytes_and_rate_and_stops_polling_once_done(node, cluster, owner, client):
    report(node, cached("acme/a"))
    (download,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="model.download", payload={"model_id": "acme/big"}, node=node
    )
    agent_side.ack(download)
    services.command_record_progress(
        node=node,
        command_id=download.pk,
        message="downloading acme/big",
        percent=25.0,
        data={"bytes_done": 256 * MIB, "bytes_total": 1024 * MIB, "bytes_per_s": 32 * MIB, "files_done": 1},
    )
    client.force_login(owner)
    url = f"/compute/model-caches/{node.pk}/"
    assert f'hx-get="{url}"' in client.get(f"/compute/nodes/{node.pk}/").content.decode().replace(
        "/compute/compute", ""
    )
    part = client.get(url + "?poll=1", **HX)
    assert part.status_code == 200
    body = part.content.decode().replace("\xa0", " ")
    assert "256.0 MB of 1.0 GB at 32.0 MB/s" in body
    assert 'hx-trigger="every 2s"' in body
    assert "acme/a" in body
    assert "Evict" in body

    agent_side.result(download, model_id="acme/big", revision="main", path="/c/big", size_bytes=1024 * MIB)
    done = client.get(url + "?poll=1", **HX)
    assert done.status_code == 286
    assert "every 2s" not in done.content.decode()
    assert "acme/big" in done.content.decode()


def test_evict_and_budget_from_the_page(node, cluster, owner, client, member_of, workspace):
    report(node, cached("acme/a"), cached("acme/b"))
    workloads.endpoint_create(actor=owner, cluster=cluster, model_id="acme/b")
    client.force_login(owner)
    body = client.get(f"/compute/model-caches/{node.pk}/").content.decode()
    assert "in use by" in body  # acme/b: no Evict button
    assert body.count(">Evict<") == 1
    a, b = (NodeModel.objects.get(node=node, model_id=m) for m in ("acme/a", "acme/b"))
    assert client.post(f"/compute/model-caches/evict/{a.pk}/").status_code == 302
    assert Command.objects.filter(command_type="model.evict", payload__model_id="acme/a").exists()
    client.post(f"/compute/model-caches/evict/{b.pk}/")
    assert not Command.objects.filter(command_type="model.evict", payload__model_id="acme/b").exists()
    assert client.post(f"/compute/model-caches/{node.pk}/budget/", {"budget_mb": "2048"}).status_code == 302
    assert NodeCache.objects.get(node=node).budget_mb == 2048

    client.force_login(member_of(workspace, "member"))
    client.post(f"/compute/model-caches/{node.pk}/budget/", {"budget_mb": "1"})
    assert NodeCache.objects.get(node=node).budget_mb == 2048
    assert ">Evict<" not in client.get(f"/compute/model-caches/{node.pk}/").content.decode()


def test_placement_says_it_took_the_node_holding_the_weights(cluster, register_node, owner):
    holder = register_node(cluster, "holder")
    register_node(cluster, "empty")
    report(holder, cached("acme/a"))
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id="acme/a")
    event = EndpointEvent.objects.get(endpoint=endpoint, kind="endpoint.starting")
    assert "placed on node holder, which holds the weights in its model cache" in event.message

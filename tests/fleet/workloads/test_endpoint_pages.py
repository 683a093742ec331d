"""Endpoint pages: the Endpoints list (overall and a cluster's tab), start/stop, one endpoint's page (settings,
replicas with their shared load, event log), the model cache on the node page, and the Commands tab's
endpoint.start offering only cached models."""

from __future__ import annotations

import pytest

from agent import protocol
from fleet.models import Command
from fleet.replica_load import LoadPublisher
from fleet.workloads import services as workloads
from fleet.workloads.models import Endpoint, EndpointStatus
from fleet.workloads.services.endpoints.events import endpoint_event_record
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}
TINY = protocol.CachedModel(model_id="acme/tiny-llama", revision="main", path="/cache/tiny", size_bytes=524_288)


@pytest.fixture
def browser(client, owner):
    client.force_login(owner)
    return client


@pytest.fixture
def running(cluster, register_node, owner):
    node = register_node(cluster, "cpu-1")
    agent_side.inventory(node, models=[TINY])
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=TINY.model_id)
    agent_side.ack(endpoint.start_command)
    agent_side.result(endpoint.start_command, port=8100, log_tail="INFO: Application startup complete.")
    endpoint.refresh_from_db()
    return endpoint


def test_endpoints_page_lists_model_node_status_url_access_and_log(browser, running, cluster):
    for url in ("/compute/endpoints/", f"/compute/clusters/{cluster.pk}/endpoints/"):
        page = browser.get(url)
        assert page.status_code == 200
        body = page.content.decode()
        assert "acme/tiny-llama" in body
        assert "cpu-1" in body
        assert "Running" in body
        assert f'data-copy-text="{running.url}"' in body
        assert f'href="/endpoints/{running.slug}/v1/models"' in body  # Open: through the ticket flow
        assert "Private (API token)" in body
        assert "none yet" in body
        assert "Application startup complete." in body
        assert f"/compute/endpoints/{running.pk}/stop/" in body


def test_stop_then_start_again_from_the_page(browser, running):
    assert browser.post(f"/compute/endpoints/{running.pk}/stop/").status_code == 302
    running.refresh_from_db()
    assert running.status == EndpointStatus.STOPPING
    agent_side.result(Command.objects.get(pk=running.stop_command_id))
    assert Endpoint.objects.get(pk=running.pk).status == EndpointStatus.STOPPED
    assert browser.post(f"/compute/endpoints/{running.pk}/start/", {"from": "cluster"}).status_code == 302
    running.refresh_from_db()
    assert running.status == EndpointStatus.PENDING
    assert running.start_command.payload["endpoint_id"] == running.slug
    # a live endpoint cannot start twice: said on the page, nothing sent
    response = browser.post(f"/compute/endpoints/{running.pk}/start/", follow=True)
    assert "only a stopped or failed one can start" in response.content.decode()
    assert Command.objects.filter(command_type="endpoint.start").count() == 2


def test_viewers_see_endpoints_but_cannot_stop_them(client, running, workspace, member_of):
    client.force_login(member_of(workspace, "viewer"))
    assert "acme/tiny-llama" in client.get("/compute/endpoints/").content.decode()
    assert client.post(f"/compute/endpoints/{running.pk}/stop/").status_code == 403
    assert Endpoint.objects.get(pk=running.pk).status == EndpointStatus.RUNNING


def test_other_workspaces_endpoints_are_invisible(client, running, make_user):
    client.force_login(make_user("stranger"))
    assert "acme/tiny-llama" not in client.get("/compute/endpoints/").content.decode()
    assert client.post(f"/compute/endpoints/{running.pk}/stop/").status_code == 404


def test_polling_stops_when_nothing_is_in_flight(browser, running, cluster):
    assert browser.get("/compute/endpoints/", **HX).status_code == 286
    Endpoint.objects.filter(pk=running.pk).update(status=EndpointStatus.STARTING)
    partial = browser.get(f"/compute/clusters/{cluster.pk}/endpoints/", **HX)
    assert partial.status_code == 200
    assert 'hx-trigger="every 5s"' in partial.content.decode()


def test_node_page_shows_its_model_cache(browser, cluster, register_node):
    node = register_node(cluster, "cpu-2")
    assert "No model in this node" in browser.get(f"/compute/nodes/{node.pk}/").content.decode()
    agent_side.inventory(node, models=[TINY])
    body = browser.get(f"/compute/nodes/{node.pk}/").content.decode()
    assert "acme/tiny-llama" in body
    assert "512.0\xa0KB" in body


def test_endpoint_start_form_offers_only_cached_models(browser, cluster, register_node):
    a = register_node(cluster, "a")
    b = register_node(cluster, "b")
    agent_side.inventory(a, models=[TINY])
    body = browser.get(f"/compute/clusters/{cluster.pk}/commands/form/?command_type=endpoint.start", **HX)
    text = body.content.decode()
    assert '<option value="acme/tiny-llama">acme/tiny-llama (on a)</option>' in text
    refused = browser.post(
        f"/compute/clusters/{cluster.pk}/commands/",
        {"command_type": "endpoint.start", "target": str(b.pk), "p-model_id": TINY.model_id},
    )
    assert refused.status_code == 400
    assert "model weights are not yet downloaded on b" in refused.content.decode()
    sent = browser.post(
        f"/compute/clusters/{cluster.pk}/commands/",
        {"command_type": "endpoint.start", "target": str(a.pk), "p-model_id": TINY.model_id},
    )
    assert sent.status_code == 302
    endpoint = Endpoint.objects.get()
    assert (endpoint.node_id, endpoint.model_id, endpoint.status) == (a.pk, TINY.model_id, EndpointStatus.PENDING)
    not_cached = browser.post(
        f"/compute/clusters/{cluster.pk}/commands/",
        {"command_type": "endpoint.start", "target": str(a.pk), "p-model_id": "acme/other"},
    )
    assert not_cached.status_code == 400
    assert "Select a valid choice" in not_cached.content.decode()


def test_an_endpoint_of_several_replicas_lists_each_with_node_state_and_in_flight(
    browser, cluster, register_node, owner
):
    for name in ("cpu-1", "cpu-2"):
        agent_side.inventory(register_node(cluster, name), models=[TINY])
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=TINY.model_id, min_replicas=2)
    first = endpoint.replicas.order_by("created_at", "server_id").first()
    agent_side.result(first.start_command, port=8100)
    page = browser.get("/compute/endpoints/", **HX).content.decode()
    items = page.split('<ul class="replicas"')[1].split("</ul>")[0]
    assert items.count("<li ") == 2
    assert f'data-replica="{first.server_id}"><a href="/compute/nodes/{first.node_id}/">' in items
    assert "Running" in items
    assert "Pending" in items
    assert items.count("0 in flight") == 2


def test_the_endpoint_page_shows_settings_replicas_with_their_shared_load_and_the_event_log(
    client, running, workspace, member_of
):
    Endpoint.objects.filter(pk=running.pk).update(target_in_flight=8, target_tokens_per_s=250, scale_cooldown_s=90)
    endpoint_event_record(endpoint=running, kind="endpoint.scaled", message="scaled 1 → 2: 31 requests in flight")
    (replica,) = running.replicas.all()
    client.force_login(member_of(workspace, "viewer"))  # any member reads it
    assert f"/compute/endpoints/{running.pk}/" in client.get("/compute/endpoints/").content.decode()  # linked
    web = LoadPublisher(name="test-web")
    try:
        web.publish({replica.server_id: (5, 900, 42.5)})
        body = client.get(f"/compute/endpoints/{running.pk}/").content.decode()
        table = client.get(f"/compute/endpoints/{running.pk}/", **HX).content.decode()
    finally:
        web.publish({})
    assert "8 requests in flight" in body
    assert "250 tokens/s" in body
    assert "90 s" in body
    assert "1 to 1" in body
    row = body[body.index(f'data-replica="{replica.server_id}"') :]
    assert "cpu-1" in row[:600]
    assert '<td data-label="Requests in flight" class="in-flight">5</td>' in row
    assert '<td data-label="Tokens/s" class="tokens-per-s">42.5</td>' in row
    events = body[body.index('id="events"') :]
    assert events.index("scaled 1 → 2: 31 requests in flight") < events.index("endpoint.starting")  # newest first
    assert "Stop</button>" not in body  # a viewer reads, never operates
    assert table.startswith('<section class="card" id="replicas"')
    assert 'hx-trigger="every 3s"' in table
    assert '<td data-label="Requests in flight" class="in-flight">5</td>' in table
    assert "Event log" not in table


def test_the_endpoint_page_of_another_workspace_is_a_404(client, running, make_user):
    client.force_login(make_user("stranger"))
    assert client.get(f"/compute/endpoints/{running.pk}/").status_code == 404
    assert client.get(f"/compute/endpoints/{running.pk}/", **HX).status_code == 404

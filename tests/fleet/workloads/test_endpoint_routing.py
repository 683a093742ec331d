"""An endpoint's routing policy: chosen at creation (API, the cluster's Endpoints form), changed at once
without a rolling update (API `update/`, the endpoint's page; Owners and Admins), 400 with the field's
message for an unknown policy, shown on the page and in the API, and carried by the proxy's route."""

from __future__ import annotations

import pytest

from agent import protocol
from audit.models import AuditEntry
from fleet.proxy import endpoint_routes
from fleet.workloads import services as workloads
from fleet.workloads.models import Endpoint, EndpointEvent, EndpointReplica, EndpointStatus
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db

TINY = protocol.CachedModel(model_id="acme/tiny", revision="main", path="/cache/main", size_bytes=5)


@pytest.fixture
def nodes(cluster, register_node):
    made = [register_node(cluster, name) for name in ("a", "b")]
    for node in made:
        agent_side.inventory(node, models=[TINY])
    return made


@pytest.fixture
def running(nodes, cluster, owner):
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id="acme/tiny", min_replicas=2)
    for port, replica in enumerate(EndpointReplica.objects.filter(endpoint=endpoint), start=8001):
        agent_side.result(replica.start_command, port=port)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.RUNNING
    return endpoint


def test_the_api_creates_with_a_policy_and_refuses_an_unknown_one(nodes, cluster, owner, api_client_for):
    api = api_client_for(owner)
    body = {"cluster": str(cluster.pk), "model_id": "acme/tiny"}
    bad = api.post("/api/v1/endpoints/", {**body, "routing_policy": "round_robin"}, format="json")
    assert bad.status_code == 400, bad.content
    assert "routing_policy" in bad.json()
    assert not Endpoint.objects.exists()
    plain = api.post("/api/v1/endpoints/", body, format="json")
    assert plain.status_code == 201, plain.content
    assert plain.json()["routing_policy"] == "least_load"  # the default
    made = api.post("/api/v1/endpoints/", {**body, "routing_policy": "prefix"}, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["routing_policy"] == "prefix"
    assert Endpoint.objects.get(pk=made.json()["id"]).routing_policy == "prefix"


def test_update_changes_the_policy_at_once_without_rolling_the_replicas(running, owner, api_client_for):
    api = api_client_for(owner)
    url = f"/api/v1/endpoints/{running.pk}/update/"
    bad = api.post(url, {"routing_policy": "sticky"}, format="json")
    assert bad.status_code == 400, bad.content
    assert "routing_policy" in bad.json()
    done = api.post(url, {"routing_policy": "session"}, format="json")
    assert done.status_code == 200, done.content
    assert done.json()["routing_policy"] == "session"
    assert not any(r["replacement_of"] for r in done.json()["replicas"])  # no rolling update
    assert EndpointReplica.objects.filter(endpoint=running).count() == 2
    event = EndpointEvent.objects.get(endpoint=running, kind="endpoint.routing")
    assert event.data["routing_policy"] == {"old": "least_load", "new": "session"}
    assert AuditEntry.objects.filter(action="endpoint.routing", outcome="ok").count() == 1
    route = endpoint_routes._load_route(running.slug)
    assert route.routing == "session"  # what the proxy routes by
    assert len(route.replicas) == 2


def test_a_member_changes_it_as_members_update_endpoints(running, workspace, member_of, api_client_for):
    answer = api_client_for(member_of(workspace, "member")).post(
        f"/api/v1/endpoints/{running.pk}/update/", {"routing_policy": "prefix"}, format="json"
    )
    assert answer.status_code == 200, answer.content
    running.refresh_from_db()
    assert running.routing_policy == "prefix"


def test_viewers_cannot_change_it(running, workspace, member_of, api_client_for, client):
    user = member_of(workspace, "viewer")
    answer = api_client_for(user).post(
        f"/api/v1/endpoints/{running.pk}/update/", {"routing_policy": "prefix"}, format="json"
    )
    assert answer.status_code == 403
    client.force_login(user)
    page = client.get(f"/compute/endpoints/{running.pk}/").content.decode()
    assert "Least load" in page
    assert f"/compute/endpoints/{running.pk}/routing/" not in page
    assert client.post(f"/compute/endpoints/{running.pk}/routing/", {"routing_policy": "prefix"}).status_code == 403
    running.refresh_from_db()
    assert running.routing_policy == "least_load"


def test_the_page_shows_and_changes_the_policy(running, owner, client):
    client.force_login(owner)
    page = client.get(f"/compute/endpoints/{running.pk}/").content.decode()
    assert f'action="/compute/endpoints/{running.pk}/routing/"' in page
    assert '<option value="prefix">Prompt prefix affinity</option>' in page
    assert "Requests routed" in page
    assert "Affinity hits" in page
    bad = client.post(f"/compute/endpoints/{running.pk}/routing/", {"routing_policy": "nope"})
    assert bad.status_code == 400
    assert "routing" in bad.content.decode().lower()
    done = client.post(f"/compute/endpoints/{running.pk}/routing/", {"routing_policy": "prefix"})
    assert done.status_code == 302
    running.refresh_from_db()
    assert running.routing_policy == "prefix"
    page = client.get(f"/compute/endpoints/{running.pk}/").content.decode()
    assert '<option value="prefix" selected>' in page


def test_the_create_form_takes_a_policy(nodes, cluster, owner, client):
    client.force_login(owner)
    tab = client.get(f"/compute/clusters/{cluster.pk}/endpoints/").content.decode()
    assert 'name="routing_policy"' in tab
    form = {"model_id": "acme/tiny", "revision": "main", "gpus": 0, "min_vram_mb": 0, "min_replicas": 1}
    form |= {"idle_timeout_s": 300, "server_args": ""}
    bad = client.post(f"/compute/clusters/{cluster.pk}/endpoints/new/", {**form, "routing_policy": "x"})
    assert bad.status_code == 400
    assert not Endpoint.objects.exists()
    done = client.post(f"/compute/clusters/{cluster.pk}/endpoints/new/", {**form, "routing_policy": "session"})
    assert done.status_code == 302, done.content.decode()[:2000]
    assert Endpoint.objects.get().routing_policy == "session"


def test_the_api_and_the_page_show_requests_routed_and_affinity_hits(running, owner, api_client_for, client):
    from fleet import replica_load
    from fleet.replica_load import LoadPublisher

    first, second = EndpointReplica.objects.filter(endpoint=running).order_by("created_at", "server_id")
    other_process = LoadPublisher(name="test-routing-figures")
    try:
        other_process.publish({first.server_id: (1, 0, 0.0, 40, 30), second.server_id: (0, 0, 0.0, 10, 0)})
        body = api_client_for(owner).get(f"/api/v1/endpoints/{running.pk}/").json()
        client.force_login(owner)
        page = client.get(f"/compute/endpoints/{running.pk}/", HTTP_HX_REQUEST="true").content.decode()
    finally:
        other_process.publish({})
        replica_load.discard()
    figures = {r["server_id"]: (r["requests_routed"], r["affinity_hits"]) for r in body["replicas"]}
    assert figures == {first.server_id: (40, 30), second.server_id: (10, 0)}
    assert '<td data-label="Requests routed" class="routed">40</td>' in page
    assert "30 <span" in page
    assert "(75 %)" in page

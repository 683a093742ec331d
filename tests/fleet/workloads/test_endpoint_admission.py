"""An endpoint's concurrency limit and queue bounds: set at creation (API) or later (API `admission/`, the
endpoint's page; Owners and Admins), 400 with the field's message for a number out of bounds, 403 for a
Member; the limit defaults to the server's --max-num-seqs (else 256); the API and the page show the limit,
the bounds and the queue's live figures; the proxy's route carries them."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from agent import protocol
from fleet import admission
from fleet.proxy import endpoint_routes
from fleet.replica_load import LoadPublisher
from fleet.workloads import services as workloads
from fleet.workloads.models import Endpoint
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db

TINY = protocol.CachedModel(model_id="acme/tiny", revision="main", path="/cache/main", size_bytes=5)


@pytest.fixture
def node(cluster, register_node):
    made = register_node(cluster, "a")
    agent_side.inventory(made, models=[TINY])
    return made


def test_the_api_creates_with_a_limit_and_queue_and_refuses_bad_numbers(node, cluster, owner, api_client_for):
    api = api_client_for(owner)
    body = {"cluster": str(cluster.pk), "model_id": "acme/tiny"}
    for field, value in (("max_concurrency", 0), ("queue_max_depth", -1), ("queue_max_wait_s", "soon")):
        bad = api.post("/api/v1/endpoints/", {**body, field: value}, format="json")
        assert bad.status_code == 400, bad.content
        assert field in bad.json()
    assert not Endpoint.objects.exists()
    plain = api.post("/api/v1/endpoints/", {**body, "server_args": ["--max-num-seqs", "16"]}, format="json")
    assert plain.status_code == 201, plain.content
    shown = plain.json()
    assert (shown["max_concurrency"], shown["concurrency_limit"]) == (None, 16)  # from --max-num-seqs
    assert shown["queue"]["max_depth"] == 1024  # the defaults
    assert shown["queue"]["max_wait_s"] == 60.0
    assert shown["queue"]["waiting"] == 0
    made = api.post(
        "/api/v1/endpoints/",
        {**body, "max_concurrency": 4, "queue_max_depth": 0, "queue_max_wait_s": 5, "target_queued": 3},
        format="json",
    )
    assert made.status_code == 201, made.content
    assert made.json()["concurrency_limit"] == 4
    assert made.json()["target_queued"] == 3
    route = endpoint_routes._load_route(Endpoint.objects.get(pk=made.json()["id"]).slug)
    assert route.queue == admission.QueuePolicy(made.json()["id"], limit=4, depth=0, wait_s=5.0, cold_wait_s=5.0)


def test_owners_change_it_members_may_not_and_the_api_shows_the_live_queue(
    node, cluster, owner, workspace, member_of, api_client_for
):
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id="acme/tiny")
    url = f"/api/v1/endpoints/{endpoint.pk}/admission/"
    member = api_client_for(member_of(workspace, "member")).post(url, {"max_concurrency": 2}, format="json")
    assert member.status_code == 403
    api = api_client_for(owner)
    bad = api.post(url, {"queue_max_wait_s": 0}, format="json")
    assert bad.status_code == 400
    assert "queue_max_wait_s" in bad.json()
    unknown = api.post(url, {"queue_depth": 3}, format="json")
    assert unknown.status_code == 400
    done = api.post(url, {"max_concurrency": 2, "queue_max_depth": 7}, format="json")
    assert done.status_code == 200, done.content
    assert (done.json()["concurrency_limit"], done.json()["queue"]["max_depth"]) == (2, 7)
    kept = api.post(url, {"queue_max_wait_s": 9}, format="json")  # what is left out is kept
    assert (kept.json()["max_concurrency"], kept.json()["queue_max_wait_s"]) == (2, 9)
    reset = api.post(url, {"max_concurrency": None}, format="json")
    assert reset.json()["concurrency_limit"] == 256  # back to the default

    other = LoadPublisher(name="test-admission-api")
    try:  # another web process: 4 waiting, and of the last window 4 admitted (waits 0, 0, 0.05, 2 s), 1 refused
        other.publish({}, queues={str(endpoint.pk): (4, (2, 0, 0, 0, 1, 0, 0, 0, 0, 1), 1)})
        queue = api.get(f"/api/v1/endpoints/{endpoint.pk}/").json()["queue"]
        page = Client()
        page.force_login(owner)
        html = page.get(reverse("workloads:endpoint_detail", args=[endpoint.pk]), HTTP_HX_REQUEST="true")
    finally:
        other.publish({})
    assert (queue["waiting"], queue["admitted"], queue["refused"]) == (4, 4, 1)
    assert (queue["wait_p50_s"], queue["wait_p99_s"]) == (0.0, 2.5)
    text = html.content.decode()  # the polled part of the page (live without reload)
    assert 'data-waiting="4"' in text
    assert 'data-refused="1"' in text
    assert '<span class="queue-wait-p99">2.500</span>' in text


def test_the_page_form_sets_it_for_owners_and_says_what_is_wrong(node, cluster, owner, workspace, member_of):
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id="acme/tiny")
    url = reverse("workloads:endpoint_admission", args=[endpoint.pk])
    page = Client()
    page.force_login(owner)
    detail = page.get(reverse("workloads:endpoint_detail", args=[endpoint.pk])).content.decode()
    assert 'id="admission-form"' in detail
    assert "256 requests in flight per replica" in detail
    wrong = page.post(url, {"max_concurrency": "-3", "from": "detail"}, follow=True)
    assert "was not changed" in wrong.content.decode()
    page.post(url, {"max_concurrency": "3", "queue_max_depth": "", "queue_max_wait_s": "20", "from": "detail"})
    endpoint.refresh_from_db()
    assert (endpoint.max_concurrency, endpoint.queue_max_depth, endpoint.queue_max_wait_s) == (3, None, 20)
    members = Client()
    members.force_login(member_of(workspace, "member"))
    assert members.post(url, {"max_concurrency": "9"}).status_code == 403

"""An endpoint's per-key limits (`key_requests_per_min`, `key_tokens_per_min`) are set through the API, the
endpoint's page (and its create form) and the admin; bounds answer 400, other roles 403; audited."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from audit.models import AuditEntry
from fleet.workloads.models import Endpoint, EndpointStatus
from tests.fleet import agent_side
from tests.fleet.workloads.test_workload_api import LLAMA
from tests.support.endpoints import endpoint_row

pytestmark = pytest.mark.django_db


@pytest.fixture
def endpoint(cluster, node) -> Endpoint:
    return endpoint_row(cluster=cluster, node=node, model_id="org/m", status=EndpointStatus.RUNNING, port=81)


def test_the_api_shows_and_sets_the_limits_with_bounds_and_roles(api_client_for, owner, member_of, workspace, endpoint):
    api = api_client_for(owner)
    got = api.get(f"/api/v1/endpoints/{endpoint.pk}/").json()
    assert (got["key_requests_per_min"], got["key_tokens_per_min"]) == (None, None)
    url = f"/api/v1/endpoints/{endpoint.pk}/limits/"
    answer = api.post(url, {"key_requests_per_min": 30, "key_tokens_per_min": 5000}, format="json")
    assert answer.status_code == 200, answer.json()
    assert (answer.json()["key_requests_per_min"], answer.json()["key_tokens_per_min"]) == (30, 5000)
    answer = api.post(url, {"key_tokens_per_min": None}, format="json")  # one cleared, the other kept
    assert (answer.json()["key_requests_per_min"], answer.json()["key_tokens_per_min"]) == (30, None)
    for bad in ({"key_requests_per_min": 0}, {"key_tokens_per_min": 2**31}, {"key_requests_per_min": "x"}):
        answer = api.post(url, bad, format="json")
        assert answer.status_code == 400
        assert set(answer.json()) == set(bad)
    answer = api.post(url, {"key_request_per_min": 3}, format="json")
    assert answer.status_code == 400
    assert "key_request_per_min" in answer.json()
    member = api_client_for(member_of(workspace, "member"))
    assert member.post(url, {"key_requests_per_min": 1}, format="json").status_code == 403
    endpoint.refresh_from_db()
    assert (endpoint.key_requests_per_min, endpoint.key_tokens_per_min) == (30, None)
    entry = AuditEntry.objects.filter(action="endpoint.set_key_limits").latest("created_at")
    assert entry.detail["key_requests_per_min"] == 30


def test_the_api_creates_an_endpoint_with_its_limits(api_client_for, owner, cluster, node):
    agent_side.inventory(node, models=[LLAMA])
    body = {"cluster": str(cluster.pk), "model_id": LLAMA.model_id, "key_requests_per_min": 12}
    answer = api_client_for(owner).post("/api/v1/endpoints/", body, format="json")
    assert answer.status_code == 201, answer.json()
    assert answer.json()["key_requests_per_min"] == 12
    assert Endpoint.objects.get(pk=answer.json()["id"]).key_requests_per_min == 12
    body["key_tokens_per_min"] = 2**31
    assert api_client_for(owner).post("/api/v1/endpoints/", body, format="json").status_code == 400


def test_the_endpoint_page_shows_and_sets_the_limits(client, owner, member_of, workspace, endpoint):
    client.force_login(owner)
    page = client.get(f"/compute/endpoints/{endpoint.pk}/").content.decode()
    assert 'id="key-limits-form"' in page
    answer = client.post(
        f"/compute/endpoints/{endpoint.pk}/limits/",
        {"key_requests_per_min": "20", "key_tokens_per_min": "", "from": "detail"},
    )
    assert answer.status_code == 302
    endpoint.refresh_from_db()
    assert (endpoint.key_requests_per_min, endpoint.key_tokens_per_min) == (20, None)
    assert "20 requests/min" in client.get(f"/compute/endpoints/{endpoint.pk}/").content.decode()
    client.post(f"/compute/endpoints/{endpoint.pk}/limits/", {"key_requests_per_min": "0", "from": "detail"})
    endpoint.refresh_from_db()
    assert endpoint.key_requests_per_min == 20  # refused (a message says why)
    client.force_login(member_of(workspace, "viewer"))
    assert 'id="key-limits-form"' not in client.get(f"/compute/endpoints/{endpoint.pk}/").content.decode()
    assert client.post(f"/compute/endpoints/{endpoint.pk}/limits/", {"key_requests_per_min": "1"}).status_code == 403


def test_operators_set_the_limits_in_the_admin(client, endpoint):
    staff = get_user_model().objects.create_superuser("ops", password="pw-ops")
    client.force_login(staff)
    change = f"/admin/fleet/endpoint/{endpoint.pk}/change/"
    page = client.get(change)
    assert page.status_code == 200
    assert 'name="key_tokens_per_min"' in page.content.decode()
    assert 'name="model_id"' not in page.content.decode()  # the rest is read only
    answer = client.post(change, {"key_requests_per_min": "7", "key_tokens_per_min": "900"})
    assert answer.status_code == 302, answer.content.decode()[:2000]
    endpoint.refresh_from_db()
    assert (endpoint.key_requests_per_min, endpoint.key_tokens_per_min, endpoint.model_id) == (7, 900, "org/m")
    assert AuditEntry.objects.get(action="endpoint.set_key_limits").actor_name == "ops"

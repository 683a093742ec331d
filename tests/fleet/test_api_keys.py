"""API keys: created by a member for themselves, secret shown once, rights = scopes ∩ current role."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from audit.models import AuditEntry
from fleet.workloads import services as workload_services
from tenancy import api_keys
from tenancy import services as tenancy
from tenancy.models import ApiKey

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_key_cache(settings):
    settings.API_KEY_CACHE_S = 0  # every request re-reads the key (the cache has tests of its own)
    api_keys.forget_grants()


def key_client(raw: str, scheme: str = "Bearer") -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{scheme} {raw}")
    return client


def make_key(user, workspace, scopes, **extra) -> str:
    return workload_services.api_key_create(actor=user, workspace=workspace, name="k", scopes=scopes, **extra)[1]


def test_a_member_creates_a_key_whose_secret_is_shown_once_and_stored_hashed(workspace, member_of, api_client_for):
    user = member_of(workspace, "viewer")
    api = api_client_for(user)
    body = {"workspace": str(workspace.pk), "name": "laptop", "scopes": ["read", "invoke"]}
    created = api.post("/api/v1/api-keys/", body, format="json")
    assert created.status_code == 201, created.content
    raw = created.json()["key"]
    assert raw.startswith("ctk_")
    assert created.json()["key_prefix"] == raw[:13] + "…"
    row = ApiKey.objects.get(pk=created.json()["id"])
    assert row.secret_hash == api_keys.hash_key(raw)
    assert raw not in str(row.__dict__)
    listed = api.get("/api/v1/api-keys/").json()["results"]
    assert [k["name"] for k in listed] == ["laptop"]
    assert "key" not in listed[0]
    assert "key" not in api.get(f"/api/v1/api-keys/{row.pk}/").json()
    assert AuditEntry.objects.filter(action="api_key.create", target_id=str(row.pk)).exists()
    # the key works at once, and the newcomer never needed manage.py
    assert key_client(raw).get("/api/v1/workspaces/").status_code == 200


def test_bad_input_is_a_400_with_field_messages(workspace, owner, api_client_for):
    api = api_client_for(owner)
    answer = api.post("/api/v1/api-keys/", {"workspace": str(workspace.pk), "name": "x", "scopes": ["root"]})
    assert answer.status_code == 400
    assert "scopes" in answer.json()
    past = (timezone.now() - timedelta(days=1)).isoformat()
    body = {"workspace": str(workspace.pk), "name": "x", "scopes": ["read"], "expires_at": past}
    answer = api.post("/api/v1/api-keys/", body, format="json")
    assert answer.status_code == 400
    assert "expires_at" in answer.json()


def test_a_key_reaches_only_its_workspace(workspace, other_workspace, owner, make_user):
    tenancy.membership_set(workspace=other_workspace, user=owner, role="owner")
    raw = make_key(owner, workspace, ["read"])
    names = [w["name"] for w in key_client(raw).get("/api/v1/workspaces/").json()["results"]]
    assert names == [workspace.name]
    assert key_client(raw).get(f"/api/v1/workspaces/{other_workspace.pk}/").status_code == 404


@pytest.mark.parametrize(
    ("role", "scopes", "read", "operate"),
    [
        ("owner", ["read"], 200, 403),  # the key's scope bounds the owner
        ("owner", ["operate"], 200, 201),
        ("member", ["operate"], 200, 403),  # the owner's role bounds the key
        ("owner", ["invoke"], 403, 403),  # an invoke key is for endpoints only
    ],
)
def test_rights_are_the_scopes_within_the_role(workspace, member_of, role, scopes, read, operate):
    user = member_of(workspace, role)
    client = key_client(make_key(user, workspace, scopes))
    assert client.get("/api/v1/clusters/").status_code == read
    created = client.post("/api/v1/clusters/", {"workspace": str(workspace.pk), "name": "c1"}, format="json")
    assert created.status_code == operate, created.content


def test_a_lowered_role_lowers_the_key(workspace, member_of):
    user = member_of(workspace, "admin")
    client = key_client(make_key(user, workspace, ["operate"]))
    assert client.post("/api/v1/clusters/", {"workspace": str(workspace.pk), "name": "a"}).status_code == 201
    tenancy.membership_set(workspace=workspace, user=user, role="viewer")
    assert client.post("/api/v1/clusters/", {"workspace": str(workspace.pk), "name": "b"}).status_code == 403
    tenancy.membership_remove(workspace=workspace, user=user)
    assert client.get("/api/v1/clusters/").status_code in (401, 403)


def test_an_expired_key_is_refused(workspace, owner):
    raw = make_key(owner, workspace, ["read"], expires_at=timezone.now() + timedelta(hours=1))
    assert key_client(raw).get("/api/v1/clusters/").status_code == 200
    ApiKey.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    answer = key_client(raw).get("/api/v1/clusters/")
    assert answer.status_code in (401, 403)
    assert "expired" in answer.json()["detail"]


def test_revoking_refuses_the_key_and_is_audited(workspace, owner, api_client_for):
    raw = make_key(owner, workspace, ["read"])
    key = ApiKey.objects.get()
    assert key_client(raw, "Token").get("/api/v1/clusters/").status_code == 200  # the old scheme name works too
    api = api_client_for(owner)
    assert api.delete(f"/api/v1/api-keys/{key.pk}/").status_code == 204
    assert key_client(raw).get("/api/v1/clusters/").status_code in (401, 403)
    assert api.delete(f"/api/v1/api-keys/{key.pk}/").status_code == 409
    assert AuditEntry.objects.filter(action="api_key.revoke", target_id=str(key.pk)).exists()


def test_keys_are_private_to_their_owner_and_cannot_mint_keys(workspace, owner, member_of, api_client_for):
    raw = make_key(owner, workspace, ["operate"])
    key = ApiKey.objects.get()
    admin = member_of(workspace, "admin")
    assert api_client_for(admin).get(f"/api/v1/api-keys/{key.pk}/").status_code == 404
    assert api_client_for(admin).delete(f"/api/v1/api-keys/{key.pk}/").status_code == 404
    body = {"workspace": str(workspace.pk), "name": "child", "scopes": ["operate"]}
    assert key_client(raw).post("/api/v1/api-keys/", body, format="json").status_code == 403


def test_older_drf_tokens_keep_working(workspace, owner):
    token = Token.objects.create(user=owner)
    assert key_client(token.key, "Token").get("/api/v1/clusters/").status_code == 200


def test_last_use_is_recorded_at_most_once_a_minute(workspace, owner):
    raw = make_key(owner, workspace, ["read"])
    key = ApiKey.objects.get()
    api_keys._last_written.pop(key.pk, None)
    key_client(raw).get("/api/v1/clusters/", REMOTE_ADDR="10.1.2.3")
    key.refresh_from_db()
    first = key.last_used_at
    assert first is not None
    assert key.last_used_ip == "10.1.2.3"
    key_client(raw).get("/api/v1/clusters/", REMOTE_ADDR="10.9.9.9")
    key.refresh_from_db()
    assert (key.last_used_at, key.last_used_ip) == (first, "10.1.2.3")


def test_cached_rights_are_read_again_once_they_expire(workspace, owner, settings, monkeypatch):
    settings.API_KEY_CACHE_S = 0.5
    raw = make_key(owner, workspace, ["read"])
    clock = [1000.0]
    monkeypatch.setattr(api_keys.time, "monotonic", lambda: clock[0])
    assert api_keys.grant_for(raw) is not None
    ApiKey.objects.update(revoked_at=timezone.now())  # as another replica would
    assert api_keys.grant_for(raw) is not None  # still cached
    clock[0] += 0.5
    assert api_keys.grant_for(raw) is None


def test_the_settings_page_creates_shows_once_and_revokes(client, workspace, owner):
    client.force_login(owner)
    page = client.get("/compute/api-keys/")
    assert page.status_code == 200
    assert b"No API keys yet" in page.content
    body = {"workspace": str(workspace.pk), "name": "ci", "scopes": ["read", "invoke"], "requests_per_min": "60"}
    created = client.post("/compute/api-keys/", body)
    # POST-redirect-GET: the POST answers with a redirect, so reloading the page that shows the secret never
    # posts the form again (it used to render the secret in the POST's answer: a reload made a second key)
    assert (created.status_code, created["Location"]) == (302, "/compute/api-keys/")
    key = ApiKey.objects.get()
    shown = client.get("/compute/api-keys/")
    assert "no-store" in shown["Cache-Control"]
    raw = shown.context["created"][1]
    assert raw.encode() in shown.content
    assert b"Copy it now" in shown.content
    assert key.secret_hash == api_keys.hash_key(raw)
    assert key.requests_per_min == 60
    again = client.get("/compute/api-keys/")  # the reload: the secret was shown once, no second key
    assert raw.encode() not in again.content
    assert key.display.encode() in again.content
    assert b"Copy it now" not in again.content
    assert ApiKey.objects.count() == 1
    refused = client.post("/compute/api-keys/", {"workspace": str(workspace.pk), "name": ""})
    assert refused.status_code == 400
    assert b"This field is required." in refused.content
    assert ApiKey.objects.count() == 1
    client.post(f"/compute/api-keys/{key.pk}/revoke/")
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert key_client(raw).get("/api/v1/clusters/").status_code in (401, 403)


def test_the_settings_page_binds_each_label_to_its_checkbox_and_lists_endpoints_as_checkboxes(client, workspace, owner):
    """Each scope and endpoint is a checkbox inside its own label (no Ctrl-click multi-select)."""
    from fleet import services as fleet_services
    from fleet.workloads.models import EndpointStatus
    from tests.support.endpoints import endpoint_row

    cluster = fleet_services.cluster_create(actor=owner, workspace=workspace, name="prod")
    endpoint = endpoint_row(cluster=cluster, node=None, model_id="acme/tiny", status=EndpointStatus.RUNNING)
    client.force_login(owner)
    page = client.get("/compute/api-keys/").content.decode()
    assert '<select name="endpoints"' not in page
    assert " multiple" not in page
    for i, label in enumerate(("Read the API", "Change things", "Invoke endpoints")):
        found = re.search(
            rf'<label class="choice" for="id_scopes_{i}"><input type="checkbox" name="scopes" value="\w+" '
            rf'[^>]*id="id_scopes_{i}"[^>]*> <span>{label}[^<]*</span></label>',
            page,
        )
        assert found, label
    assert re.search(
        r'<label class="choice" for="id_endpoints_0"><input type="checkbox" name="endpoints" '
        rf'value="{endpoint.pk}"[^>]*> <span>endpoint-{endpoint.slug} \(acme/tiny\) · Acme</span></label>',
        page,
    )
    assert 'data-filter-choices="#id_endpoints-list"' in page
    body = {"workspace": str(workspace.pk), "name": "one", "scopes": ["invoke"], "endpoints": [str(endpoint.pk)]}
    assert client.post("/compute/api-keys/", body).status_code == 302
    assert list(ApiKey.objects.get(name="one").endpoint_grants.values_list("endpoint_id", flat=True)) == [endpoint.pk]


def test_a_key_limited_to_chosen_endpoints_is_limited_on_the_management_api_too(workspace, owner, cluster, node):
    """It lists, reads, stops and updates its endpoints alone (others answer 404), creates none, and its usage
    report shows none of the others; an unlimited key of the same owner still sees all."""
    from datetime import UTC, datetime

    from fleet.models import Command
    from fleet.usage.models import UsageRollup
    from fleet.workloads.models import EndpointStatus
    from tests.support.endpoints import endpoint_row

    mine = endpoint_row(cluster=cluster, node=node, model_id="org/a", status=EndpointStatus.RUNNING, port=81)
    other = endpoint_row(cluster=cluster, node=node, model_id="org/b", status=EndpointStatus.RUNNING, port=82)
    limited = key_client(make_key(owner, workspace, ["operate", "invoke"], endpoints=[mine]))
    unlimited = key_client(make_key(owner, workspace, ["operate"]))

    assert [e["id"] for e in limited.get("/api/v1/endpoints/").json()["results"]] == [str(mine.pk)]
    assert {e["id"] for e in unlimited.get("/api/v1/endpoints/").json()["results"]} == {str(mine.pk), str(other.pk)}
    assert limited.get(f"/api/v1/endpoints/{other.pk}/").status_code == 404
    assert limited.get(f"/api/v1/endpoints/{other.pk}/events/").status_code == 404
    commands = Command.objects.count()
    assert limited.post(f"/api/v1/endpoints/{other.pk}/stop/").status_code == 404
    update = {"server_args": ["--max-num-seqs", "8"]}
    assert limited.post(f"/api/v1/endpoints/{other.pk}/update/", update, format="json").status_code == 404
    assert limited.post(f"/api/v1/endpoints/{other.pk}/update_revision/", {"revision": "x"}).status_code == 404
    assert Command.objects.count() == commands  # nothing was sent to the node for the other endpoint
    other.refresh_from_db()
    assert other.status == EndpointStatus.RUNNING
    assert limited.get(f"/api/v1/endpoints/{mine.pk}/").status_code == 200
    assert limited.post(f"/api/v1/endpoints/{mine.pk}/stop/").status_code == 200
    create = {"cluster": str(cluster.pk), "model_id": "org/a"}
    assert limited.post("/api/v1/endpoints/", create, format="json").status_code == 403

    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    for endpoint in (mine, other):
        UsageRollup.objects.create(
            granularity="hour",
            bucket_start=hour,
            workspace_id=workspace.pk,
            subject_kind="endpoint",
            subject_id=endpoint.pk,
            requests=5,
        )
    assert limited.get("/api/v1/usage/?period=24h").json()["totals"]["requests"] == 5
    assert limited.get(f"/api/v1/usage/?period=24h&endpoint={other.pk}").status_code == 400
    assert unlimited.get("/api/v1/usage/?period=24h").json()["totals"]["requests"] == 10


def test_the_answers_holding_a_new_keys_secret_are_never_cached(workspace, owner, api_client_for, client):
    body = {"workspace": str(workspace.pk), "name": "ci", "scopes": ["read"]}
    created = api_client_for(owner).post("/api/v1/api-keys/", body, format="json")
    assert created.status_code == 201
    assert "no-store" in created["Cache-Control"]
    listed = api_client_for(owner).get("/api/v1/api-keys/")
    assert "key" not in listed.json()["results"][0]
    client.force_login(owner)
    assert client.post("/compute/api-keys/", body).status_code == 302  # then the page shows the secret once
    page = client.get("/compute/api-keys/")
    assert page.context["created"][1].encode() in page.content
    assert "no-store" in page["Cache-Control"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("requests_per_min", 10**12), ("tokens_per_min", 2**31), ("requests_per_min", 0), ("tokens_per_min", -1)],
)
def test_limits_out_of_bounds_are_a_400_naming_the_bound(workspace, owner, api_client_for, client, field, value):
    body = {"workspace": str(workspace.pk), "name": "x", "scopes": ["invoke"], field: value}
    answer = api_client_for(owner).post("/api/v1/api-keys/", body, format="json")
    assert answer.status_code == 400
    assert list(answer.json()) == [field]
    bound = "2147483647" if value > 0 else "1"
    assert bound in " ".join(answer.json()[field])
    client.force_login(owner)
    page = client.post("/compute/api-keys/", {**body, field: str(value)})
    assert page.status_code == 400
    assert field in page.context["form"].errors
    with pytest.raises(ValidationError) as refused:  # the service holds the same bounds
        workload_services.api_key_create(
            actor=owner, workspace=workspace, name="x", scopes=["invoke"], **{field: value}
        )
    assert field in refused.value.message_dict
    assert not ApiKey.objects.exists()

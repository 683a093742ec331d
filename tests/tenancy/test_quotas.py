"""Quotas set by the workspace's Owner (API, page) and by staff in the admin: permissions, validation,
usage shown back, an audit entry for every change, the row made with the workspace."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction

from audit.models import AuditEntry
from tenancy import quotas
from tenancy.models import Workspace, WorkspaceQuota
from tenancy.services import workspace_quota_set

pytestmark = pytest.mark.django_db


def url(workspace) -> str:
    return f"/api/v1/workspaces/{workspace.pk}/quotas/"


def line(body, name) -> dict:
    return next(q for q in body["quotas"] if q["quota"] == name)


def test_a_new_workspace_has_its_row_with_every_quota_unlimited(workspace):
    row = WorkspaceQuota.objects.get(workspace=workspace)
    assert all(v is None for v in quotas.limits_of(row).values())
    quotas.admit(workspace_id=workspace.pk, ask={"containers": 1000, "gpus": 64})  # nothing to refuse


def test_admit_makes_the_row_of_a_workspace_made_without_it(db):
    ws = Workspace.objects.create(name="Bare", slug="bare")  # as the admin's add form does
    with transaction.atomic():
        quotas.admit(workspace_id=ws.pk, ask={"containers": 1})
    assert WorkspaceQuota.objects.filter(workspace=ws).count() == 1


def test_every_change_is_audited_with_what_changed(api_client_for, owner, workspace):
    api = api_client_for(owner)
    api.patch(url(workspace), {"gpus": 4}, format="json")
    api.patch(url(workspace), {"gpus": 4}, format="json")  # no change: no entry
    api.patch(url(workspace), {"gpus": None, "endpoints": 2}, format="json")
    entries = list(AuditEntry.objects.filter(action="workspace.set_quotas").order_by("created_at"))
    assert [e.detail["changes"] for e in entries] == [
        {"gpus": {"from": None, "to": 4}},
        {"gpus": {"from": 4, "to": None}, "endpoints": {"from": None, "to": 2}},
    ]
    assert {(e.actor_name, e.target_type, e.target_id, e.workspace_id, e.outcome) for e in entries} == {
        ("owner", "workspace", str(workspace.pk), workspace.pk, "ok")
    }


@pytest.mark.parametrize("role", ["admin", "member", "viewer"])
def test_only_the_owner_changes_quotas_and_every_member_reads_them(api_client_for, member_of, workspace, role):
    api = api_client_for(member_of(workspace, role))
    response = api.patch(url(workspace), {"gpus": 1}, format="json")
    assert response.status_code == 403
    assert "Owner" in response.json()["detail"]
    read = api.get(url(workspace))
    assert read.status_code == 200
    assert read.json()["can_edit"] is False
    assert WorkspaceQuota.objects.get(workspace=workspace).gpus is None
    assert not AuditEntry.objects.filter(action="workspace.set_quotas").exists()


def test_another_workspace_is_404(api_client_for, owner, other_workspace):
    api = api_client_for(owner)
    assert api.get(url(other_workspace)).status_code == 404
    assert api.patch(url(other_workspace), {"gpus": 1}, format="json").status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [({"gpus": 1.5}, "gpus"), ({"containers": -1}, "containers"), ({"vram_gib": "lots"}, "vram_gib")],
)
def test_bad_limits_are_field_errors(api_client_for, owner, workspace, body, field):
    response = api_client_for(owner).patch(url(workspace), body, format="json")
    assert response.status_code == 400
    assert field in response.json()


def test_the_schema_documents_the_quota_routes(api_client_for, owner):
    schema = api_client_for(owner).get("/api/schema/?format=json").json()
    assert {"get", "patch"} <= set(schema["paths"]["/api/v1/workspaces/{id}/quotas/"])


# ---- pages


def test_owner_sets_quotas_on_the_page(client, owner, workspace):
    client.force_login(owner)
    page = client.get(f"/workspaces/{workspace.pk}/quotas/").content.decode()
    assert "Save quotas" in page
    response = client.post(f"/workspaces/{workspace.pk}/quotas/", {"gpus": "2", "memory_gib": "16.5"})
    assert response.status_code == 302
    row = WorkspaceQuota.objects.get(workspace=workspace)
    assert (row.gpus, row.memory_gib, row.containers) == (2, 16.5, None)
    assert AuditEntry.objects.filter(action="workspace.set_quotas", actor_name="owner").count() == 1


def test_an_admin_sees_quotas_but_cannot_post(client, member_of, workspace):
    client.force_login(member_of(workspace, "admin"))
    page = client.get(f"/workspaces/{workspace.pk}/quotas/").content.decode()
    assert "Save quotas" not in page
    assert "Only the workspace's Owner changes its quotas." in page
    assert client.post(f"/workspaces/{workspace.pk}/quotas/", {"gpus": "2"}).status_code == 403
    assert WorkspaceQuota.objects.get(workspace=workspace).gpus is None


def test_home_page_shows_usage_against_each_quota(client, owner, workspace):
    client.force_login(owner)
    workspace_quota_set(actor=owner, workspace=workspace, limits={"containers": 0})
    page = client.get("/").content.decode()
    assert f'href="/workspaces/{workspace.pk}/quotas/"' in page
    assert 'data-quota="containers" class="at-limit"' in page
    assert 'data-quota="gpus"' in page


def test_staff_set_any_workspaces_quotas_in_the_admin_and_it_is_audited(client, workspace):
    staff = get_user_model().objects.create_superuser("ops", password="pw-ops")
    client.force_login(staff)
    change = f"/admin/tenancy/workspacequota/{workspace.pk}/change/"
    assert client.get(change).status_code == 200
    response = client.post(change, {"ray_workers": "3", "ray_clusters": "1"})
    assert response.status_code == 302, response.content.decode()[:2000]
    row = WorkspaceQuota.objects.get(workspace=workspace)
    assert (row.ray_workers, row.ray_clusters) == (3, 1)
    entry = AuditEntry.objects.get(action="workspace.set_quotas")
    assert entry.actor_name == "ops"
    assert entry.detail["changes"] == {"ray_workers": {"from": None, "to": 3}, "ray_clusters": {"from": None, "to": 1}}


def test_admit_counts_the_same_whether_the_workspace_id_is_a_uuid_or_its_text(owner, workspace):
    from raymgr.models import RayCluster

    workspace_quota_set(actor=owner, workspace=workspace, limits={"ray_clusters": 1})
    compute = workspace.compute_clusters.create(name="c")
    RayCluster.objects.create(workspace=workspace, compute_cluster=compute, name="r")
    for given in (workspace.pk, str(workspace.pk)):
        assert quotas.usage([given], ["ray_clusters"]) == {given: {"ray_clusters": 1}}
        with transaction.atomic(), pytest.raises(quotas.QuotaExceeded):
            quotas.admit(workspace_id=given, ask={"ray_clusters": 1})


def test_an_unknown_quota_name_is_a_400_naming_it_and_changes_nothing(api_client_for, owner, workspace):
    api = api_client_for(owner)
    response = api.patch(url(workspace), {"gpu": 4}, format="json")  # a typo of "gpus"
    assert response.status_code == 400
    assert response.json() == {"gpu": ["Unknown field."]}
    response = api.patch(url(workspace), {"gpus": 4, "ram_gib": 8}, format="json")
    assert response.status_code == 400
    assert list(response.json()) == ["ram_gib"]
    assert WorkspaceQuota.objects.get(workspace=workspace).gpus is None  # nothing of either request applied
    assert not AuditEntry.objects.filter(action="workspace.set_quotas").exists()
    assert api.patch(url(workspace), {"gpus": 4}, format="json").status_code == 200

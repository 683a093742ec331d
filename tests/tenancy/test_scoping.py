"""Every API queryset is scoped to the caller's workspaces; other workspaces' rows are 404."""

from __future__ import annotations

import pytest
from rest_framework import viewsets

from tenancy.mixins import WorkspaceScopedMixin
from tenancy.models import Workspace
from tenancy.selectors import scope_to_user, workspace_list

pytestmark = pytest.mark.django_db


def test_workspace_list_shows_only_own_workspaces(owner, workspace, other_workspace, api_client_for):
    response = api_client_for(owner).get("/api/v1/workspaces/")
    assert response.status_code == 200
    names = [row["name"] for row in response.json()["results"]]
    assert names == ["Acme"]
    assert response.json()["results"][0]["role"] == "owner"


def test_other_workspace_detail_is_404_not_403(owner, workspace, other_workspace, api_client_for):
    client = api_client_for(owner)
    assert client.get(f"/api/v1/workspaces/{workspace.pk}/").status_code == 200
    assert client.get(f"/api/v1/workspaces/{other_workspace.pk}/").status_code == 404
    assert client.get(f"/api/v1/workspaces/{other_workspace.pk}/members/").status_code == 404


def test_members_listing_of_own_workspace(owner, workspace, member_of, api_client_for):
    member_of(workspace, "viewer")
    response = api_client_for(owner).get(f"/api/v1/workspaces/{workspace.pk}/members/")
    assert response.status_code == 200
    assert sorted((m["username"], m["role"]) for m in response.json()) == [
        ("owner", "owner"),
        ("viewer-acme", "viewer"),
    ]


def test_anonymous_api_access_is_refused(workspace):
    from rest_framework.test import APIClient

    assert APIClient().get("/api/v1/workspaces/").status_code in (401, 403)


def test_scope_to_user_filters_by_workspace_field(owner, workspace, other_workspace):
    scoped = scope_to_user(Workspace.objects.all(), user=owner, workspace_field="pk")
    assert list(scoped) == [workspace]
    assert list(workspace_list(user=owner)) == [workspace]


def test_mixin_refuses_subclasses_that_override_get_queryset():
    with pytest.raises(TypeError, match="get_base_queryset"):

        class Leaky(WorkspaceScopedMixin, viewsets.ReadOnlyModelViewSet):  # pragma: no cover - must not build
            queryset = Workspace.objects.all()

            def get_queryset(self):
                return Workspace.objects.all()

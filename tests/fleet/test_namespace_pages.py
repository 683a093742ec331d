"""Settings → Namespaces: create, bind to a compute cluster, delete; 400 on bad input, 403 for members."""

from __future__ import annotations

import pytest

from fleet import services
from fleet.models import Namespace

pytestmark = pytest.mark.django_db


@pytest.fixture
def browser(client, owner):
    client.force_login(owner)
    return client


def test_create_bind_unbind_and_delete_from_the_page(browser, workspace, cluster):
    page = browser.get("/compute/namespaces/").content.decode()
    assert "No namespaces yet." in page
    assert "Create Namespace" in page
    assert 'href="/compute/namespaces/"' in page  # the sidebar
    response = browser.post(
        "/compute/namespaces/", {"workspace": str(workspace.pk), "name": "team-a", "cluster": str(cluster.pk)}
    )
    assert response.status_code == 302
    namespace = Namespace.objects.get(workspace=workspace, name="team-a")
    assert namespace.cluster == cluster
    page = browser.get("/compute/namespaces/").content.decode()
    assert f'<a href="/compute/clusters/{cluster.pk}/nodes/">prod</a>' in page
    assert browser.post(f"/compute/namespaces/{namespace.pk}/bind/", {"cluster": ""}).status_code == 302
    namespace.refresh_from_db()
    assert namespace.cluster is None
    assert browser.post(f"/compute/namespaces/{namespace.pk}/bind/", {"cluster": str(cluster.pk)}).status_code == 302
    namespace.refresh_from_db()
    assert namespace.cluster == cluster
    assert browser.post(f"/compute/namespaces/{namespace.pk}/delete/").status_code == 302
    assert not Namespace.objects.filter(pk=namespace.pk).exists()


@pytest.mark.parametrize(
    ("name", "message"),
    [("Bad Name", "DNS label"), ("", "This field is required"), ("dup", "already exists")],
)
def test_bad_input_is_400_with_the_field_message(browser, owner, workspace, name, message):
    services.namespace_create(actor=owner, workspace=workspace, name="dup")
    response = browser.post("/compute/namespaces/", {"workspace": str(workspace.pk), "name": name, "cluster": ""})
    assert response.status_code == 400
    assert message in response.content.decode()


def test_binding_to_another_workspaces_cluster_is_400(browser, owner, workspace, other_cluster):
    namespace = services.namespace_create(actor=owner, workspace=workspace, name="team-b")
    response = browser.post(f"/compute/namespaces/{namespace.pk}/bind/", {"cluster": str(other_cluster.pk)})
    assert response.status_code == 400
    assert "No such cluster in this workspace." in response.content.decode()
    response = browser.post(f"/compute/namespaces/{namespace.pk}/bind/", {"cluster": "not-a-uuid"})
    assert response.status_code == 400


def test_members_see_namespaces_but_cannot_change_them(client, owner, workspace, cluster, member_of):
    namespace = services.namespace_create(actor=owner, workspace=workspace, name="team-c", cluster_id=cluster.pk)
    client.force_login(member_of(workspace, "member"))
    page = client.get("/compute/namespaces/").content.decode()
    assert "team-c" in page
    assert "Create Namespace" not in page
    assert "Only workspace Owners and Admins can create namespaces." in page
    assert client.post("/compute/namespaces/", {"workspace": str(workspace.pk), "name": "x"}).status_code == 403
    assert client.post(f"/compute/namespaces/{namespace.pk}/delete/").status_code == 403
    assert client.post(f"/compute/namespaces/{namespace.pk}/bind/", {"cluster": ""}).status_code == 403
    assert Namespace.objects.filter(pk=namespace.pk, cluster=cluster).exists()


def test_other_workspaces_namespaces_are_404(browser, other_workspace):
    theirs = services.namespace_create(
        actor=other_workspace.memberships.get().user, workspace=other_workspace, name="theirs"
    )
    assert "theirs" not in browser.get("/compute/namespaces/").content.decode()
    assert browser.post(f"/compute/namespaces/{theirs.pk}/delete/").status_code == 404


def test_namespace_page_query_count_is_constant(browser, owner, workspace, cluster, django_assert_num_queries):
    services.namespace_create(actor=owner, workspace=workspace, name="ns-0", cluster_id=cluster.pk)
    browser.get("/compute/namespaces/")
    with django_assert_num_queries(5) as first:
        browser.get("/compute/namespaces/")
    for i in range(1, 6):
        services.namespace_create(actor=owner, workspace=workspace, name=f"ns-{i}", cluster_id=cluster.pk)
    with django_assert_num_queries(len(first.captured_queries)):
        assert browser.get("/compute/namespaces/").content.decode().count('<tr id="namespace-') == 6

"""Ray pages: list, create form, detail tabs (htmx partials, polling), actions, admin."""

from __future__ import annotations

import pytest
from django.test import Client

from raymgr.models import RayCluster
from tests.raymgr.conftest import finish, last_command, start_head

pytestmark = pytest.mark.django_db


@pytest.fixture
def browser(owner) -> Client:
    client = Client()
    client.force_login(owner)
    return client


def test_dashboard_and_empty_list(browser, compute):
    assert "No Ray clusters yet" in browser.get("/ray/").content.decode()
    page = browser.get("/ray/clusters/").content.decode()
    assert "Create Cluster" in page


def test_create_form_defaults_and_submit(browser, compute, add_node):
    add_node(compute, "cpu-1")
    page = browser.get("/ray/clusters/new/").content.decode()
    assert '<option value="2.9.0" selected>2.9.0</option>' in page  # the documented default
    assert '<option value="2.60.0">2.60.0</option>' in page
    assert 'name="max_workers" value="10"' in page
    assert "nodes minus one" in page
    assert "prod (Acme)" in page
    form = {
        "name": "train",
        "compute_cluster": str(compute.pk),
        "ray_version": "2.60.0",
        "runtime": "docker",
        "min_workers": "0",
        "max_workers": "10",
        "idle_timeout_s": "60",
        "gcs_port": "6381",
        "dashboard_port": "8265",
    }
    response = browser.post("/ray/clusters/new/", form)
    cluster = RayCluster.objects.get()
    assert response.status_code == 302
    assert response["Location"] == f"/ray/clusters/{cluster.pk}/"
    again = browser.post("/ray/clusters/new/", form).content.decode()
    assert "already exists" in again
    assert RayCluster.objects.count() == 1


def test_viewers_get_no_form_and_cannot_post(compute, workspace, member_of):
    client = Client()
    client.force_login(member_of(workspace, "viewer"))
    assert "only workspace Owners and Admins" in client.get("/ray/clusters/new/").content.decode()
    response = client.post("/ray/clusters/new/", {"name": "x", "compute_cluster": str(compute.pk)})
    assert response.status_code == 403
    assert not RayCluster.objects.exists()


def test_detail_tabs_and_polling_while_pending(browser, compute, add_node, make_ray):
    add_node(compute, "cpu-1")
    cluster = make_ray()
    page = browser.get(f"/ray/clusters/{cluster.pk}/").content.decode()
    for tab in ("Summary", "Nodes", "Jobs", "Logs", "Events"):
        assert f">{tab}</a>" in page
    assert 'hx-trigger="every 3s"' in page  # pending: the summary polls
    assert "Open Ray Dashboard" not in page
    start_head(cluster, ip="10.3.3.3")
    partial = browser.get(
        f"/ray/clusters/{cluster.pk}/?tab=summary", HTTP_HX_REQUEST="true", HTTP_HX_TRIGGER="ray-summary"
    )
    assert partial.status_code == 286  # running: polling stops
    body = partial.content.decode()
    assert "<html" not in body
    assert "10.3.3.3" in body
    assert "c-head" in body
    assert "every 3s" not in body
    page = browser.get(f"/ray/clusters/{cluster.pk}/").content.decode()
    assert f'href="/ray/clusters/{cluster.pk}/dashboard/"' in page
    nodes = browser.get(f"/ray/clusters/{cluster.pk}/?tab=nodes", HTTP_HX_REQUEST="true").content.decode()
    assert "Head" in nodes
    assert "cpu-1" in nodes
    events = browser.get(f"/ray/clusters/{cluster.pk}/?tab=events", HTTP_HX_REQUEST="true").content.decode()
    assert "Status → running" in events
    RayCluster.objects.filter(pk=cluster.pk).update(
        last_status={"logs": {"gcs": "GCS started <ok>", "autoscaler": "a"}}
    )
    logs = browser.get(f"/ray/clusters/{cluster.pk}/?tab=logs", HTTP_HX_REQUEST="true").content.decode()
    assert "GCS started &lt;ok&gt;" in logs
    assert browser.get(f"/ray/clusters/{cluster.pk}/?tab=bogus").status_code == 404


def test_actions_stop_start_delete_with_confirm(browser, compute, add_node, make_ray):
    add_node(compute, "cpu-1")
    cluster = make_ray()
    page = browser.get(f"/ray/clusters/{cluster.pk}/").content.decode()
    assert "This cannot be undone" in page
    browser.post(f"/ray/clusters/{cluster.pk}/stop/")
    cluster.refresh_from_db()
    assert cluster.status == "stopping"
    response = browser.post(f"/ray/clusters/{cluster.pk}/start/", follow=True)
    assert "still stopping: wait until it has stopped" in response.content.decode()
    finish(last_command("ray.node.stop", cluster_id=str(cluster.pk)))
    cluster.refresh_from_db()
    assert cluster.status == "stopped"
    response = browser.post(f"/ray/clusters/{cluster.pk}/stop/", follow=True)
    assert "stopped Ray cluster cannot become stopping" in response.content.decode()
    browser.post(f"/ray/clusters/{cluster.pk}/start/")
    cluster.refresh_from_db()
    assert cluster.status == "pending"
    response = browser.post(f"/ray/clusters/{cluster.pk}/delete/")
    assert response["Location"] == "/ray/clusters/"
    cluster.refresh_from_db()
    assert cluster.status == "deleting"


def test_other_workspaces_clusters_are_404(browser, other_workspace, make_user):
    from fleet import services as fleet_services
    from raymgr import services

    theirs_owner = other_workspace.memberships.get().user
    compute = fleet_services.cluster_create(actor=theirs_owner, workspace=other_workspace, name="c")
    theirs = services.ray_cluster_create(
        actor=theirs_owner, workspace=other_workspace, compute_cluster=compute, name="t"
    )
    assert browser.get(f"/ray/clusters/{theirs.pk}/").status_code == 404
    assert browser.post(f"/ray/clusters/{theirs.pk}/delete/").status_code == 404
    assert ">t</a>" not in browser.get("/ray/clusters/").content.decode()


def test_viewer_sees_cluster_without_buttons_and_gets_403_on_actions(compute, workspace, member_of, make_ray):
    cluster = make_ray()
    client = Client()
    client.force_login(member_of(workspace, "viewer"))
    page = client.get(f"/ray/clusters/{cluster.pk}/").content.decode()
    assert cluster.name in page
    assert ">Delete</button>" not in page
    assert client.post(f"/ray/clusters/{cluster.pk}/delete/").status_code == 403


def test_admin_lists_ray_clusters(compute, make_ray, make_user):
    make_ray("visible")
    admin = make_user("root", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(admin)
    assert "visible" in client.get("/admin/raymgr/raycluster/").content.decode()


def test_create_form_leaves_the_gcs_port_empty_so_the_node_picks_a_free_one(browser, compute, add_node):
    add_node(compute, "cpu-1")
    page = browser.get("/ray/clusters/new/").content.decode()
    assert 'value="6379"' not in page  # Redis's port on the machine the README sets up
    form = {
        "name": "dflt",
        "compute_cluster": str(compute.pk),
        "ray_version": "2.9.0",
        "runtime": "docker",
        "min_workers": "0",
        "max_workers": "10",
        "idle_timeout_s": "60",
        "gcs_port": "",
        "dashboard_port": "8265",
    }
    assert browser.post("/ray/clusters/new/", form).status_code == 302
    cluster = RayCluster.objects.get()
    assert cluster.gcs_port is None
    assert cluster.status == "pending"

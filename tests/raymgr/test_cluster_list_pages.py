"""Ray → Clusters: row actions (Start / Stop / Delete) and the create form's defaults."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from fleet import services as fleet_services
from raymgr.models import RayCluster, RayClusterStatus
from tests.raymgr.conftest import finish, last_command

pytestmark = pytest.mark.django_db


@pytest.fixture
def browser(owner) -> Client:
    client = Client()
    client.force_login(owner)
    return client


def _row(page: str, cluster: RayCluster) -> str:
    found = re.search(rf'<tr id="ray-cluster-{cluster.pk}">(.*?)</tr>', page, re.S)
    assert found
    return found[1]


def test_rows_offer_the_actions_of_their_state_and_come_back_to_the_list(browser, compute, add_node, make_ray):
    add_node(compute, "cpu-1")
    cluster = make_ray()
    row = _row(browser.get("/ray/clusters/").content.decode(), cluster)
    assert ">Stop</button>" in row
    assert ">Delete</button>" in row
    assert ">Start</button>" not in row  # pending: nothing to start
    response = browser.post(f"/ray/clusters/{cluster.pk}/stop/", {"next": "list"})
    assert response.status_code == 302
    assert response["Location"] == "/ray/clusters/"
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.STOPPING  # its head's stop is under way
    row = _row(browser.get("/ray/clusters/").content.decode(), cluster)
    assert ">Start</button>" not in row  # not until it has stopped
    assert ">Stop</button>" not in row
    assert ">Delete</button>" in row
    finish(last_command("ray.node.stop", cluster_id=str(cluster.pk)))
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.STOPPED
    row = _row(browser.get("/ray/clusters/").content.decode(), cluster)
    assert ">Start</button>" in row
    assert ">Stop</button>" not in row
    assert browser.post(f"/ray/clusters/{cluster.pk}/stop/", {"next": "list"})["Location"] == "/ray/clusters/"
    assert browser.post(f"/ray/clusters/{cluster.pk}/delete/", {"next": "list"})["Location"] == "/ray/clusters/"


def test_viewers_get_no_row_actions(compute, add_node, make_ray, workspace, member_of):
    add_node(compute, "cpu-1")
    cluster = make_ray()
    client = Client()
    client.force_login(member_of(workspace, "viewer"))
    row = _row(client.get("/ray/clusters/").content.decode(), cluster)
    assert "<button" not in row
    assert client.post(f"/ray/clusters/{cluster.pk}/stop/", {"next": "list"}).status_code in (302, 403)
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.PENDING


def test_list_query_count_is_constant(browser, compute, add_node, make_ray, django_assert_num_queries):
    add_node(compute, "cpu-1")
    make_ray("r0")
    browser.get("/ray/clusters/")
    with django_assert_num_queries(4) as first:
        browser.get("/ray/clusters/")
    for i in range(1, 4):
        make_ray(f"r{i}", gcs_port=6390 + i)
    with django_assert_num_queries(len(first.captured_queries)):
        assert browser.get("/ray/clusters/").content.decode().count('<tr id="ray-cluster-') == 4


def test_create_form_never_preselects_a_cluster_without_online_nodes(browser, owner, workspace, compute, add_node):
    empty = fleet_services.cluster_create(actor=owner, workspace=workspace, name="aaa-empty")  # first by name
    page = browser.get("/ray/clusters/new/").content.decode()
    assert re.search(rf'<option value="{empty.pk}"[^>]*disabled[^>]*>aaa-empty \(Acme\) — no online nodes', page)
    assert "Clusters without an online node are disabled: the head node needs one to start." in page
    select = re.search(r'<select name="compute_cluster".*?</select>', page, re.S)[0]
    assert re.findall(r'<option value="([^"]*)"[^>]* selected', select) == [""]  # the "Choose" prompt only
    add_node(compute, "cpu-1")
    page = browser.get("/ray/clusters/new/").content.decode()
    assert re.search(rf'<option value="{compute.pk}" selected>prod \(Acme\)</option>', page)
    for label in ("Compute Cluster", "Ray Version", "Min Workers", "Max Workers"):
        assert label in page


def test_create_on_a_cluster_without_online_nodes_is_400_and_says_why(browser, owner, workspace):
    empty = fleet_services.cluster_create(actor=owner, workspace=workspace, name="empty")
    form = {
        "name": "train",
        "compute_cluster": str(empty.pk),
        "ray_version": "2.60.0",
        "runtime": "docker",
        "min_workers": "0",
        "max_workers": "1",
        "idle_timeout_s": "60",
        "gcs_port": "6381",
        "dashboard_port": "8265",
    }
    response = browser.post("/ray/clusters/new/", form)
    assert response.status_code == 400
    assert "empty has no online nodes: the Ray head needs one." in response.content.decode()
    assert not RayCluster.objects.exists()

"""The Ray API: create/list/inspect, start/stop with 409s, nodes, events, 400/403/404."""

from __future__ import annotations

import pytest

from fleet import services as fleet_services
from fleet.models import Command
from tests.raymgr.conftest import finish, last_command, start_head

pytestmark = pytest.mark.django_db

URL = "/api/v1/ray/clusters/"


def body(workspace, compute, **extra):
    return {"workspace": str(workspace.pk), "compute_cluster": str(compute.pk), "name": "train", **extra}


def test_create_defaults_and_read_back(api_client_for, owner, workspace, compute, add_node):
    add_node(compute, "cpu-1")
    client = api_client_for(owner)
    response = client.post(URL, body(workspace, compute, gcs_port=6381), format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["status"] == "pending"
    assert (data["ray_version"], data["min_workers"], data["max_workers"], data["idle_timeout_s"]) == (
        "2.9.0",
        0,
        10,
        60,
    )
    assert data["head_hostname"] == "cpu-1"
    assert data["dashboard_url"] == f"/ray/clusters/{data['id']}/dashboard/"
    assert Command.objects.get().command_type == "ray.head.start"
    detail = client.get(f"{URL}{data['id']}/").json()
    assert detail["name"] == "train"


def test_field_errors_are_400(api_client_for, owner, workspace, compute):
    client = api_client_for(owner)
    response = client.post(URL, body(workspace, compute, name="Not A Label", max_workers=-1), format="json")
    assert response.status_code == 400
    assert "max_workers" in response.json()
    response = client.post(URL, body(workspace, compute, name="ok", min_workers=5, max_workers=2), format="json")
    assert response.status_code == 400
    assert "max_workers" in response.json()
    response = client.post(URL, body(workspace, compute, name="Bad Name"), format="json")
    assert response.status_code == 400
    assert "name" in response.json()
    client.post(URL, body(workspace, compute, name="dup"), format="json")
    response = client.post(URL, body(workspace, compute, name="dup"), format="json")
    assert response.status_code == 400
    assert "already exists" in response.json()["name"][0]
    assert client.post(URL, ["not", "an", "object"], format="json").status_code == 400


def test_viewers_and_members_cannot_write(api_client_for, workspace, compute, member_of, owner):
    cluster_id = api_client_for(owner).post(URL, body(workspace, compute), format="json").json()["id"]
    for role in ("viewer", "member"):
        client = api_client_for(member_of(workspace, role))
        assert client.post(URL, body(workspace, compute, name="x"), format="json").status_code == 403
        assert client.post(f"{URL}{cluster_id}/stop/").status_code == 403
        assert client.delete(f"{URL}{cluster_id}/").status_code == 403
        assert client.get(f"{URL}{cluster_id}/").status_code == 200


def test_other_workspaces_are_404(api_client_for, owner, workspace, compute, other_workspace):
    theirs_owner = other_workspace.memberships.get().user
    theirs_compute = fleet_services.cluster_create(actor=theirs_owner, workspace=other_workspace, name="c")
    theirs = api_client_for(theirs_owner).post(URL, body(other_workspace, theirs_compute), format="json").json()
    client = api_client_for(owner)
    assert client.get(f"{URL}{theirs['id']}/").status_code == 404
    assert client.post(f"{URL}{theirs['id']}/stop/").status_code == 404
    assert client.get(f"{URL}{theirs['id']}/nodes/").status_code == 404
    assert client.get(URL).json()["results"] == []
    assert client.post(URL, body(other_workspace, theirs_compute), format="json").status_code == 404
    # Own workspace, foreign compute cluster: a field error.
    response = client.post(URL, body(workspace, theirs_compute), format="json")
    assert response.status_code == 400
    assert "compute_cluster" in response.json()


def test_start_stop_and_illegal_transitions_are_409(api_client_for, owner, workspace, compute, add_node):
    add_node(compute, "cpu-1")
    client = api_client_for(owner)
    cluster_id = client.post(URL, body(workspace, compute, gcs_port=6381), format="json").json()["id"]
    response = client.post(f"{URL}{cluster_id}/start/")
    assert response.status_code == 409
    assert "pending Ray cluster cannot become pending" in response.json()["detail"]
    assert client.post(f"{URL}{cluster_id}/stop/").json()["status"] == "stopping"
    assert client.post(f"{URL}{cluster_id}/stop/").status_code == 409
    finish(last_command("ray.node.stop", cluster_id=cluster_id))  # its head's stop finished: stopped
    assert client.get(f"{URL}{cluster_id}/").json()["status"] == "stopped"
    assert client.post(f"{URL}{cluster_id}/stop/").status_code == 409
    assert client.post(f"{URL}{cluster_id}/start/").json()["status"] == "pending"


def test_version_change_while_running_is_400(api_client_for, owner, workspace, compute, add_node):
    from raymgr.models import RayCluster

    add_node(compute, "cpu-1")
    client = api_client_for(owner)
    cluster_id = client.post(URL, body(workspace, compute, gcs_port=6381), format="json").json()["id"]
    start_head(RayCluster.objects.get(pk=cluster_id))
    response = client.patch(f"{URL}{cluster_id}/", {"ray_version": "2.61.0"}, format="json")
    assert response.status_code == 400
    assert "ray_version" in response.json()
    response = client.patch(f"{URL}{cluster_id}/", {"max_workers": 3}, format="json")
    assert response.json()["max_workers"] == 3


def test_nodes_and_events(api_client_for, owner, workspace, compute, add_node):
    from raymgr.models import RayCluster

    add_node(compute, "cpu-1")
    client = api_client_for(owner)
    cluster_id = client.post(URL, body(workspace, compute, gcs_port=6381), format="json").json()["id"]
    start_head(RayCluster.objects.get(pk=cluster_id), ip="10.9.9.9")
    nodes = client.get(f"{URL}{cluster_id}/nodes/").json()
    assert [(n["role"], n["status"], n["ip"], n["hostname"]) for n in nodes] == [
        ("head", "running", "10.9.9.9", "cpu-1")
    ]
    kinds = [e["kind"] for e in client.get(f"{URL}{cluster_id}/events/").json()["results"]]
    assert kinds[0] == "status"
    assert {"created", "placement", "status"} <= set(kinds)


def test_delete_is_202_while_nodes_stop_and_204_when_nothing_runs(api_client_for, owner, workspace, compute, add_node):
    client = api_client_for(owner)
    failed = client.post(URL, body(workspace, compute, name="nothing"), format="json").json()
    assert failed["status"] == "failed"
    assert client.delete(f"{URL}{failed['id']}/").status_code == 204
    add_node(compute, "cpu-1")
    live = client.post(URL, body(workspace, compute, gcs_port=6381), format="json").json()
    response = client.delete(f"{URL}{live['id']}/")
    assert response.status_code == 202
    assert response.json()["status"] == "deleting"


def test_list_query_count_is_constant(api_client_for, owner, workspace, compute, add_node, django_assert_num_queries):
    client = api_client_for(owner)
    for i in range(3):
        client.post(URL, body(workspace, compute, name=f"c{i}"), format="json")
    with django_assert_num_queries(2):  # count + page (scoping is a subquery)
        assert len(client.get(URL).json()["results"]) == 3


def test_ray_version_is_chosen_from_the_offered_list(api_client_for, owner, workspace, compute, add_node, settings):
    settings.RAY_VERSIONS = ["2.9.0", "2.60.0"]
    settings.RAY_PROCESS_VERSION = "2.60.0"
    add_node(compute, "cpu-1")
    client = api_client_for(owner)
    chosen = client.post(URL, body(workspace, compute, name="v260", ray_version="2.60.0"), format="json")
    assert chosen.status_code == 201, chosen.content
    assert chosen.json()["ray_version"] == "2.60.0"
    assert Command.objects.get().payload["image"] == "rayproject/ray:2.60.0"
    refused = client.post(URL, body(workspace, compute, name="v1", ray_version="1.13.0"), format="json")
    assert refused.status_code == 400
    assert refused.json()["ray_version"] == ["Choose one of the offered Ray versions: 2.9.0, 2.60.0."]
    # The process runtime runs the agent's own Ray: its version by default, no other.
    process = client.post(URL, body(workspace, compute, name="p", runtime="process", gcs_port=6390), format="json")
    assert process.status_code == 201, process.content
    assert process.json()["ray_version"] == "2.60.0"
    other = body(workspace, compute, name="p2", runtime="process", gcs_port=6391, ray_version="2.9.0")
    refused = client.post(URL, other, format="json")
    assert refused.status_code == 400
    assert "installed next to the agent (2.60.0)" in refused.json()["ray_version"][0]


def test_version_change_is_refused_with_a_clear_message_while_running(
    api_client_for, owner, workspace, compute, add_node, settings
):
    from raymgr.models import RayCluster

    settings.RAY_VERSIONS = ["2.9.0", "2.60.0"]
    add_node(compute, "cpu-1")
    client = api_client_for(owner)
    cluster_id = client.post(URL, body(workspace, compute, gcs_port=6381), format="json").json()["id"]
    start_head(RayCluster.objects.get(pk=cluster_id))
    response = client.patch(f"{URL}{cluster_id}/", {"ray_version": "2.60.0"}, format="json")
    assert response.status_code == 400
    assert response.json()["ray_version"] == [
        "The Ray version cannot change while the cluster is running: it runs Ray 2.9.0. "
        "Stop the cluster first, then change the version."
    ]
    assert client.post(f"{URL}{cluster_id}/stop/").json()["status"] == "stopping"
    finish(last_command("ray.node.stop", cluster_id=cluster_id))  # its head container is gone: stopped
    assert client.get(f"{URL}{cluster_id}/").json()["status"] == "stopped"
    response = client.patch(f"{URL}{cluster_id}/", {"ray_version": "9.9.9"}, format="json")
    assert response.status_code == 400
    assert "offered Ray versions" in response.json()["ray_version"][0]
    response = client.patch(f"{URL}{cluster_id}/", {"ray_version": "2.60.0"}, format="json")
    assert response.status_code == 200
    assert response.json()["ray_version"] == "2.60.0"


def test_stop_reads_stopping_until_its_nodes_stopped_and_start_meanwhile_is_409(
    api_client_for, owner, workspace, compute, add_node
):
    from raymgr.models import RayCluster

    add_node(compute, "cpu-1")
    client = api_client_for(owner)
    cluster_id = client.post(URL, body(workspace, compute), format="json").json()["id"]
    start_head(RayCluster.objects.get(pk=cluster_id))
    assert client.post(f"{URL}{cluster_id}/stop/").json()["status"] == "stopping"
    response = client.post(f"{URL}{cluster_id}/start/")
    assert response.status_code == 409
    assert "wait until it has stopped" in response.json()["detail"]
    assert client.get(f"{URL}?status=stopping").json()["count"] == 1
    finish(last_command("ray.node.stop", cluster_id=cluster_id))
    assert client.get(f"{URL}{cluster_id}/").json()["status"] == "stopped"
    assert client.post(f"{URL}{cluster_id}/start/").json()["status"] == "pending"


def test_create_without_a_gcs_port_lets_the_heads_node_pick_one(api_client_for, owner, workspace, compute, add_node):
    from raymgr.models import RayCluster

    add_node(compute, "cpu-1")
    client = api_client_for(owner)
    data = client.post(URL, body(workspace, compute, runtime="process"), format="json").json()
    assert data["status"] == "pending", data
    assert data["gcs_port"] is None
    assert data["head_gcs_port"] is None
    finish(last_command("ray.head.start", cluster_id=data["id"]), data={"ip": "10.0.0.2", "gcs_port": 24001})
    read = client.get(f"{URL}{data['id']}/").json()
    assert (read["status"], read["gcs_port"], read["head_gcs_port"]) == ("running", None, 24001)
    assert RayCluster.objects.get(pk=data["id"]).gcs_address == "10.0.0.2:24001"

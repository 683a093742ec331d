"""The fleet API end to end: every rule through HTTP, with pinned query counts."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from fleet import ca, services
from fleet.models import Command, CommandStatus, ComputeCluster, JoinToken, Namespace, Node, NodeStatus, RevokedSerial
from fleet.payloads import MASK
from tests.fleet import agent_side
from tests.fleet.conftest import facts_dict, make_csr_pem, make_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(api_client_for, owner) -> APIClient:
    return api_client_for(owner)


# ---- clusters


def test_create_cluster_and_list(api, workspace):
    response = api.post(
        "/api/v1/clusters/",
        {
            "workspace": str(workspace.pk),
            "name": "gpu",
            "mode": "argocd",
            "argocd_server": "https://argo",
            "argocd_token": "tok-123",
            "git_repo_url": "https://git/repo.git",
            "git_branch": "main",
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["mode"] == "argocd"
    assert body["argocd_token_set"] is True
    assert "argocd_token" not in body
    cluster = ComputeCluster.objects.get(pk=body["id"])
    assert cluster.mode_settings()["token"] == "tok-123"
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT argocd_token FROM fleet_computecluster WHERE id = %s", [cluster.pk])
        assert "tok-123" not in cursor.fetchone()[0]
    listed = api.get("/api/v1/clusters").json()
    assert [c["name"] for c in listed["results"]] == ["gpu"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "mode": "swarm"}, "mode"),
        ({"mode": "standalone"}, "name"),
        ({"name": "x" * 101}, "name"),
        ({"name": ["x"]}, "name"),
        ({"name": "x", "description": "d" * 2001}, "description"),
        ({"name": "x", "mode": "argocd"}, "argocd_server"),
    ],
)
def test_bad_cluster_input_is_400_with_field_messages(api, workspace, body, field):
    response = api.post("/api/v1/clusters/", {"workspace": str(workspace.pk), **body}, format="json")
    assert response.status_code == 400
    assert field in response.json()


def test_duplicate_cluster_name_in_workspace_is_400(api, workspace, cluster):
    response = api.post("/api/v1/clusters/", {"workspace": str(workspace.pk), "name": "prod"}, format="json")
    assert response.status_code == 400
    assert "already exists" in response.json()["name"][0]


def test_non_json_body_is_400(api, workspace):
    response = api.post("/api/v1/clusters/", "[1, 2]", content_type="application/json")
    assert response.status_code == 400


def test_mode_cannot_change(api, cluster):
    response = api.patch(f"/api/v1/clusters/{cluster.pk}/", {"mode": "kubernetes"}, format="json")
    assert response.status_code == 400
    assert "cannot be changed" in response.json()["mode"][0]
    same = api.patch(f"/api/v1/clusters/{cluster.pk}/", {"mode": "standalone", "description": "new"}, format="json")
    assert same.status_code == 200
    assert same.json()["description"] == "new"
    cluster.refresh_from_db()
    assert cluster.mode == "standalone"


def test_cluster_writes_need_operator_and_membership(api_client_for, workspace, other_workspace, cluster, member_of):
    member = api_client_for(member_of(workspace, "member"))
    assert member.get(f"/api/v1/clusters/{cluster.pk}/").status_code == 200
    assert (
        member.post("/api/v1/clusters/", {"workspace": str(workspace.pk), "name": "m"}, format="json").status_code
        == 403
    )
    assert member.patch(f"/api/v1/clusters/{cluster.pk}/", {"description": "x"}, format="json").status_code == 403
    assert member.delete(f"/api/v1/clusters/{cluster.pk}/").status_code == 403
    assert member.post(f"/api/v1/clusters/{cluster.pk}/join-tokens").status_code == 403
    # Another workspace: not found.
    assert (
        member.post("/api/v1/clusters/", {"workspace": str(other_workspace.pk), "name": "m"}, format="json").status_code
        == 404
    )
    outsider = api_client_for(other_workspace.memberships.get().user)
    assert outsider.get(f"/api/v1/clusters/{cluster.pk}/").status_code == 404
    assert outsider.delete(f"/api/v1/clusters/{cluster.pk}/").status_code == 404


def test_cluster_list_query_count_is_constant(api, owner, workspace, django_assert_num_queries):
    services.cluster_create(actor=owner, workspace=workspace, name="c0")
    with django_assert_num_queries(2):
        assert api.get("/api/v1/clusters/").status_code == 200
    for i in range(1, 6):
        services.cluster_create(actor=owner, workspace=workspace, name=f"c{i}")
    with django_assert_num_queries(2):
        assert len(api.get("/api/v1/clusters/").json()["results"]) == 6


# ---- join tokens and registration


def _register(client: APIClient, token: str, **extra) -> object:
    body = {"token": token, "csr_pem": make_csr_pem(make_key()), "facts": facts_dict(), **extra}
    return client.post("/api/v1/agent/register", body, format="json")


def test_join_token_then_register_then_node_listed(api, cluster):
    response = api.post(f"/api/v1/clusters/{cluster.pk}/join-tokens")
    assert response.status_code == 201
    body = response.json()
    assert body["token"].startswith("ct_node_")
    assert body["join_command"] == (f"curl -fsSL http://testserver/agent/install.sh | CLUSTER_TOKEN={body['token']} sh")
    assert JoinToken.objects.get().token_hash != body["token"]

    registered = _register(APIClient(), body["token"])  # no user authentication
    assert registered.status_code == 201, registered.content
    answer = registered.json()
    assert answer["tunnel_path"] == "/agent/tunnel"
    assert answer["heartbeat_interval_s"] == 30
    assert answer["ca_certificate_pem"] == ca.ca_certificate_pem()
    assert str(ca.verify_node_certificate(answer["certificate_pem"])) == answer["node_id"]
    nodes = api.get("/api/v1/nodes/", {"cluster": str(cluster.pk)}).json()["results"]
    assert [(n["id"], n["name"], n["status"]) for n in nodes] == [(answer["node_id"], "gpu-box-1", "offline")]


def test_register_refusals_leave_no_node(api, cluster, other_cluster, owner):
    raw = api.post(f"/api/v1/clusters/{cluster.pk}/join-tokens").json()["token"]
    anonymous = APIClient()
    wrong = _register(anonymous, raw, cluster_id=str(other_cluster.pk))
    assert wrong.status_code == 403
    assert wrong.json()["code"] == "token_wrong_cluster"
    assert _register(anonymous, raw).status_code == 201
    reused = _register(anonymous, raw)
    assert reused.status_code == 403
    assert reused.json() == {"detail": "This join token has already been used.", "code": "token_used"}
    expiring = api.post(f"/api/v1/clusters/{cluster.pk}/join-tokens").json()["token"]
    JoinToken.objects.filter(token_hash=services.hash_join_token(expiring)).update(
        expires_at=timezone.now() - dt.timedelta(minutes=1)
    )
    expired = _register(anonymous, expiring)
    assert expired.status_code == 403
    assert expired.json()["code"] == "token_expired"
    assert Node.objects.count() == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"csr_pem": "nope"}, "csr_pem"),
        ({"facts": {"hostname": "h", "cpu_count": "many"}}, "facts"),
        ({"facts": {"hostname": "h", "rogue": 1}}, "facts"),
        ({"facts": "host"}, "facts"),
        ({"token": None}, "token"),
    ],
)
def test_register_bad_input_is_400(api, cluster, body, field):
    raw = api.post(f"/api/v1/clusters/{cluster.pk}/join-tokens").json()["token"]
    base = {"token": raw, "csr_pem": make_csr_pem(make_key()), "facts": facts_dict()}
    response = APIClient().post("/api/v1/agent/register", {**base, **body}, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not Node.objects.exists()


# ---- nodes


def test_node_transitions_through_the_api(api, node):
    url = f"/api/v1/nodes/{node.pk}"
    assert api.post(f"{url}/cordon").json()["status"] == "cordoned"
    conflict = api.post(f"{url}/cordon")
    assert conflict.status_code == 409
    assert "cordoned" in conflict.json()["detail"]
    assert api.post(f"{url}/uncordon").json()["status"] == "online"
    assert api.post(f"{url}/uncordon").status_code == 409
    assert api.post(f"{url}/drain").json()["status"] == "cordoned"  # empty node
    renamed = api.patch(f"{url}/", {"name": "big"}, format="json")
    assert renamed.status_code == 200
    assert renamed.json()["name"] == "big"
    assert api.patch(f"{url}/", {"status": "online"}, format="json").status_code == 400
    assert api.patch(f"{url}/", {"name": ""}, format="json").status_code == 400
    assert api.patch(f"{url}/", {"name": "n" * 101}, format="json").status_code == 400
    events = api.get(f"{url}/events").json()["results"]
    assert {"cordoned", "uncordoned", "draining", "drained", "renamed"} <= {e["kind"] for e in events}


def test_node_delete_revokes(api, node):
    serial = node.certificates.get().serial
    assert api.delete(f"/api/v1/nodes/{node.pk}/").status_code == 204
    assert RevokedSerial.objects.filter(serial=serial).exists()
    assert api.get(f"/api/v1/nodes/{node.pk}/").status_code == 404


def test_node_writes_forbidden_for_members_and_hidden_from_others(
    api_client_for, workspace, other_workspace, node, member_of
):
    member = api_client_for(member_of(workspace, "member"))
    for path in ("cordon", "uncordon", "drain"):
        assert member.post(f"/api/v1/nodes/{node.pk}/{path}").status_code == 403
    assert member.delete(f"/api/v1/nodes/{node.pk}/").status_code == 403
    assert member.patch(f"/api/v1/nodes/{node.pk}/", {"name": "x"}, format="json").status_code == 403
    outsider = api_client_for(other_workspace.memberships.get().user)
    assert outsider.post(f"/api/v1/nodes/{node.pk}/cordon").status_code == 404
    assert outsider.get("/api/v1/nodes/").json()["results"] == []
    assert Node.objects.get(pk=node.pk).status == NodeStatus.ONLINE


def test_node_list_filters_and_constant_queries(api, cluster, register_node, django_assert_num_queries):
    register_node(cluster, "n0")
    with django_assert_num_queries(2):
        api.get("/api/v1/nodes/")
    for i in range(1, 5):
        register_node(cluster, f"n{i}", online=i % 2 == 0)
    with django_assert_num_queries(2):
        assert len(api.get("/api/v1/nodes/").json()["results"]) == 5
    assert {n["status"] for n in api.get("/api/v1/nodes/?status=offline").json()["results"]} == {"offline"}
    bad = api.get("/api/v1/nodes/?status=sleeping&cluster=nope")
    assert bad.status_code == 400
    assert set(bad.json()) == {"status", "cluster"}


# ---- commands


def test_dispatch_all_nodes_returns_at_once(api, cluster, register_node, django_capture_on_commit_callbacks):
    register_node(cluster, "a")
    register_node(cluster, "b")
    register_node(cluster, "off", online=False)
    with django_capture_on_commit_callbacks() as callbacks:
        response = api.post(
            f"/api/v1/clusters/{cluster.pk}/commands",
            {"command_type": "container.create", "payload": {"image": "nginx", "name": "web"}, "node_id": None},
            format="json",
        )
    assert response.status_code == 202, response.content
    body = response.json()
    assert len(body["commands"]) == 2
    assert {c["status"] for c in body["commands"]} == {"queued"}
    assert len(callbacks) == 1  # one on-commit hook enqueues a task per command
    listed = api.get(f"/api/v1/commands/?batch={body['batch_id']}").json()["results"]
    assert len(listed) == 2
    assert api.get(f"/api/v1/clusters/{cluster.pk}/commands").json()["count"] == 2


def test_dispatch_one_node(api, cluster, node):
    response = api.post(
        f"/api/v1/clusters/{cluster.pk}/commands",
        {"command_type": "model.download", "payload": {"model_id": "Qwen/Qwen2.5-0.5B"}, "node_id": str(node.pk)},
        format="json",
    )
    assert response.status_code == 202
    (command,) = Command.objects.all()
    assert command.node == node
    assert command.status == CommandStatus.QUEUED
    assert api.get(f"/api/v1/commands/{command.pk}/").json()["payload"]["model_id"] == "Qwen/Qwen2.5-0.5B"


def test_env_values_and_marked_fields_are_never_returned(api, api_client_for, workspace, member_of, cluster, node):
    body = {
        "command_type": "container.create",
        "payload": {
            "image": "vllm/vllm-openai",
            "name": "llm",
            "env": {"HF_TOKEN": "hf_top_secret"},
            "command": ["--api-key", "sk-marked"],
            "secret_fields": ["command"],
        },
        "node_id": str(node.pk),
    }
    sent = api.post(f"/api/v1/clusters/{cluster.pk}/commands", body, format="json")
    assert sent.status_code == 202, sent.content
    assert b"hf_top_secret" not in sent.content
    assert b"sk-marked" not in sent.content
    (command,) = Command.objects.all()
    agent_side.result(command, container_id="c-llm")
    viewer = api_client_for(member_of(workspace, "viewer"))
    for url in (
        f"/api/v1/commands/{command.pk}/",
        "/api/v1/commands/",
        f"/api/v1/clusters/{cluster.pk}/commands",
        "/api/v1/containers/",
    ):
        response = viewer.get(url)
        assert response.status_code == 200, url
        assert b"hf_top_secret" not in response.content, url
        assert b"sk-marked" not in response.content, url
    shown = viewer.get(f"/api/v1/commands/{command.pk}/").json()["payload"]
    assert shown["env"] == {"HF_TOKEN": MASK}
    assert shown["command"] == [MASK, MASK]
    assert shown["secret_fields"] == ["command"]
    assert command.wire_payload()["env"] == {"HF_TOKEN": "hf_top_secret"}


def test_bad_secret_marks_are_400(api, cluster, node):
    body = {"command_type": "model.download", "payload": {"model_id": "a/b", "secret_fields": ["model_id"]}}
    response = api.post(f"/api/v1/clusters/{cluster.pk}/commands", body, format="json")
    assert response.status_code == 400
    assert "none for this command type" in response.json()["payload.secret_fields"][0]
    assert not Command.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"command_type": "container.create", "payload": {"name": "web"}}, "payload.image"),
        ({"command_type": "container.fly", "payload": {}}, "command_type"),
        ({"command_type": "model.download", "payload": {"model_id": "../../etc"}}, "payload.model_id"),
        ({"command_type": "container.create", "payload": {"image": 5, "name": "web", "gpus": "x"}}, "payload.gpus"),
        ({"command_type": "container.create", "payload": ["image"]}, "payload"),
        ({"command_type": "container.stop", "payload": {"container": "c" * 300}}, "payload.container"),
        ({"command_type": "container.stop", "payload": {"container": "c"}, "node_id": "not-a-uuid"}, "node_id"),
    ],
)
def test_bad_command_input_is_400(api, cluster, node, body, field):
    response = api.post(f"/api/v1/clusters/{cluster.pk}/commands", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not Command.objects.exists()


def test_command_to_node_of_another_cluster_is_400(api, owner, workspace, cluster, register_node):
    second = services.cluster_create(actor=owner, workspace=workspace, name="second")
    foreign = register_node(second, "foreign")
    response = api.post(
        f"/api/v1/clusters/{cluster.pk}/commands",
        {"command_type": "container.stop", "payload": {"container": "c"}, "node_id": str(foreign.pk)},
        format="json",
    )
    assert response.status_code == 400
    assert "node_id" in response.json()


def test_command_conflicts_are_409(api, cluster, node, owner):
    assert (
        api.post(
            f"/api/v1/clusters/{cluster.pk}/commands",
            {"command_type": "container.create", "payload": {"image": "i", "name": "n"}, "node_id": None},
            format="json",
        ).status_code
        == 202
    )
    services.node_cordon(node=node, actor=owner)
    response = api.post(
        f"/api/v1/clusters/{cluster.pk}/commands",
        {"command_type": "container.create", "payload": {"image": "i", "name": "n"}, "node_id": None},
        format="json",
    )
    assert response.status_code == 409
    assert "No online nodes" in response.json()["detail"]


def test_only_operators_send_commands(api_client_for, workspace, other_workspace, cluster, node, member_of):
    body = {"command_type": "container.stop", "payload": {"container": "c"}}
    for role in ("member", "viewer"):
        client = api_client_for(member_of(workspace, role))
        assert client.post(f"/api/v1/clusters/{cluster.pk}/commands", body, format="json").status_code == 403
        assert client.get(f"/api/v1/clusters/{cluster.pk}/commands").status_code == 200
    outsider = api_client_for(other_workspace.memberships.get().user)
    assert outsider.post(f"/api/v1/clusters/{cluster.pk}/commands", body, format="json").status_code == 404
    assert not Command.objects.exists()


def test_command_list_query_count_is_constant(api, owner, cluster, register_node, django_assert_num_queries):
    nodes = [register_node(cluster, f"n{i}") for i in range(3)]
    services.command_dispatch(
        actor=owner, cluster=cluster, command_type="container.stop", payload={"container": "c"}, node=nodes[0]
    )
    with django_assert_num_queries(2):
        api.get("/api/v1/commands/")
    for _ in range(3):
        services.command_dispatch(
            actor=owner, cluster=cluster, command_type="container.stop", payload={"container": "c"}
        )
    with django_assert_num_queries(2):
        assert api.get("/api/v1/commands/").json()["count"] == 10


# ---- namespaces


def test_namespace_binding(api, workspace, other_cluster, cluster):
    created = api.post("/api/v1/namespaces/", {"workspace": str(workspace.pk), "name": "team-a"}, format="json")
    assert created.status_code == 201
    assert created.json()["cluster"] is None
    ns_id = created.json()["id"]
    bound = api.patch(f"/api/v1/namespaces/{ns_id}/", {"cluster": str(cluster.pk)}, format="json")
    assert bound.status_code == 200
    assert bound.json()["cluster"] == str(cluster.pk)
    assert Namespace.objects.get(pk=ns_id).cluster == cluster
    foreign = api.patch(f"/api/v1/namespaces/{ns_id}/", {"cluster": str(other_cluster.pk)}, format="json")
    assert foreign.status_code == 400
    assert "cluster" in foreign.json()
    bad = api.post("/api/v1/namespaces/", {"workspace": str(workspace.pk), "name": "Not A Label"}, format="json")
    assert bad.status_code == 400
    assert "name" in bad.json()
    dup = api.post("/api/v1/namespaces/", {"workspace": str(workspace.pk), "name": "team-a"}, format="json")
    assert dup.status_code == 400
    assert api.delete(f"/api/v1/namespaces/{ns_id}/").status_code == 204


def test_schema_lists_fleet_routes(client, owner):
    client.force_login(owner)
    schema = client.get("/api/schema/")
    assert schema.status_code == 200
    for route in (b"/api/v1/clusters/", b"/api/v1/nodes/", b"/api/v1/agent/register", b"join-tokens"):
        assert route in schema.content


def test_operators_resume_a_partition_pause_members_cannot(api, api_client_for, workspace, cluster, member_of):
    from fleet.models import ClusterEvent

    until = timezone.now() + dt.timedelta(minutes=10)
    ComputeCluster.objects.filter(pk=cluster.pk).update(automation_paused_until=until)
    assert api.get(f"/api/v1/clusters/{cluster.pk}/").json()["automation_paused_until"] is not None
    member = api_client_for(member_of(workspace, "member"))
    assert member.post(f"/api/v1/clusters/{cluster.pk}/resume-automation/").status_code == 403
    cluster.refresh_from_db()
    assert cluster.automation_paused()

    response = api.post(f"/api/v1/clusters/{cluster.pk}/resume-automation/")
    assert response.status_code == 200
    assert response.json()["automation_paused_until"] is None
    cluster.refresh_from_db()
    assert not cluster.automation_paused()
    assert ClusterEvent.objects.filter(cluster=cluster, kind="automation.resumed").exists()

"""The workload API: /api/v1/containers/, /api/v1/models/, /api/v1/endpoints/ (+ stop, events)."""

from __future__ import annotations

import pytest

from agent import protocol
from fleet.replica_load import LoadPublisher
from fleet.workloads import services as workload_services
from fleet.workloads.models import Container, Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.services.endpoints.events import endpoint_event_record
from tests.fleet import agent_side
from tests.fleet.agent_side import running

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.fleet.workloads.workload_urls")]

LLAMA = protocol.CachedModel(model_id="meta-llama/Llama-3.2-1B", revision="main", path="/cache/llama", size_bytes=5)


@pytest.fixture
def api(api_client_for, owner):
    return api_client_for(owner)


def test_containers_list_filters_and_scoping(api, cluster, register_node, other_cluster, api_client_for):
    a = register_node(cluster, "a")
    b = register_node(cluster, "b")
    agent_side.inventory(a, containers=[running("web", "c1"), running("db", "c2")])
    agent_side.inventory(b, containers=[running("job", "c3", status="exited")])
    theirs = register_node(other_cluster, "theirs")
    agent_side.inventory(theirs, containers=[running("secret", "c9")])

    body = api.get("/api/v1/containers/").json()
    assert body["count"] == 3
    assert {r["name"] for r in body["results"]} == {"web", "db", "job"}
    assert {r["name"] for r in api.get(f"/api/v1/containers/?node={a.pk}").json()["results"]} == {"web", "db"}
    assert api.get(f"/api/v1/containers/?cluster={cluster.pk}&status=exited").json()["count"] == 1
    assert api.get("/api/v1/containers/?node=nope").status_code == 400
    assert api.get("/api/v1/containers/?status=bogus").status_code == 400
    secret = theirs.containers.get()
    assert api.get(f"/api/v1/containers/{secret.pk}/").status_code == 404
    other_owner = other_cluster.workspace.memberships.get().user
    assert api_client_for(other_owner).get("/api/v1/containers/").json()["count"] == 1


def test_container_list_query_count_is_constant(api, node, django_assert_num_queries):
    agent_side.inventory(node, containers=[running("one", "c1")])
    with django_assert_num_queries(2):  # count + page
        assert api.get("/api/v1/containers/").json()["count"] == 1
    agent_side.inventory(node, containers=[running(f"w{i}", f"c{i}") for i in range(12)])
    with django_assert_num_queries(2):
        assert api.get("/api/v1/containers/").json()["count"] == 12


def test_failed_container_shows_error_help(api, cluster, register_node, owner):
    from fleet import services
    from fleet.workloads import drain

    a = register_node(cluster, "a")
    register_node(cluster, "b")
    agent_side.inventory(a, containers=[running("web", "c1")])
    services.node_drain(node=a, actor=owner)
    drain.drain_step(node_id=a.pk)
    (replacement,) = Container.objects.filter(replacement_of__isnull=False)
    agent_side.error(replacement.created_by_command, "docker_unavailable", "Cannot connect to the Docker daemon")
    (item,) = api.get("/api/v1/containers/?status=failed").json()["results"]
    assert item["id"] == str(replacement.pk)
    assert item["replacement_of"] == str(replacement.replacement_of_id)
    assert item["error_code"] == "docker_unavailable"
    assert item["error_message"] == "Cannot connect to the Docker daemon"
    assert item["error_help"]["title"] == "Docker is not running"
    assert "systemctl start docker" in item["error_help"]["fix"]


def test_models_list_shows_locations(api, cluster, register_node, django_assert_num_queries):
    a = register_node(cluster, "a")
    b = register_node(cluster, "b")
    agent_side.inventory(a, models=[LLAMA, protocol.CachedModel(model_id="org/tiny", revision="main", path="/t")])
    agent_side.inventory(b, models=[LLAMA])
    with django_assert_num_queries(2):
        body = api.get("/api/v1/models/?model_id=meta-llama/Llama-3.2-1B").json()
    assert sorted(r["node_name"] for r in body["results"]) == ["a", "b"]
    assert body["results"][0]["cluster_name"] == "prod"
    assert api.get(f"/api/v1/models/?node={b.pk}").json()["count"] == 1


def test_endpoint_create_retrieve_stop_flow(api, cluster, node, settings):
    settings.ENDPOINT_DOMAIN = "ep.test"
    agent_side.inventory(node, models=[LLAMA])
    response = api.post(
        "/api/v1/endpoints/", {"cluster": str(cluster.pk), "model_id": LLAMA.model_id, "gpus": 1}, format="json"
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["status"] == "pending"
    assert body["node"] == str(node.pk)
    assert body["url"] == f"https://endpoint-{body['slug']}.ep.test"
    endpoint = Endpoint.objects.get(pk=body["id"])
    agent_side.result(endpoint.start_command, port=8080)
    got = api.get(f"/api/v1/endpoints/{endpoint.pk}/").json()
    assert (got["status"], got["port"], got["error_help"]) == ("running", 8080, None)
    stopped = api.post(f"/api/v1/endpoints/{endpoint.pk}/stop/")
    assert stopped.status_code == 200
    assert stopped.json()["status"] == "stopping"
    assert api.post(f"/api/v1/endpoints/{endpoint.pk}/stop/").status_code == 409


def test_endpoint_placement_refusal_is_409_with_help(api, cluster, node):
    response = api.post("/api/v1/endpoints/", {"cluster": str(cluster.pk), "model_id": "org/absent"}, format="json")
    assert response.status_code == 409
    body = response.json()
    assert body["detail"] == (
        "model weights are not yet downloaded: org/absent@main is on no online node; run model.download first"
    )
    assert body["code"] == "model_not_downloaded"
    assert "model.download" in body["error_help"]["fix"]


def test_failed_endpoint_shows_agent_code_and_help(api, cluster, node, owner):
    agent_side.inventory(node, models=[LLAMA])
    endpoint = workload_services.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id)
    agent_side.error(endpoint.start_command, "insufficient_vram", "needs 20000 MB, 8000 MB free")
    got = api.get(f"/api/v1/endpoints/{endpoint.pk}/").json()
    assert got["status"] == "failed"
    assert got["failure_code"] == "insufficient_vram"
    assert got["failure_message"] == "needs 20000 MB, 8000 MB free"
    assert got["error_help"]["title"] == "Insufficient GPU VRAM"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model_id": "bad id!"}, "model_id"),
        ({"model_id": "a" * 201}, "model_id"),
        ({"model_id": ["x"]}, "model_id"),
        ({"gpus": "many"}, "gpus"),
        ({"gpus": -2}, "gpus"),
        ({"min_vram_mb": 1.5}, "min_vram_mb"),
        ({"revision": "a..b"}, "revision"),
        ({"node": "not-a-uuid"}, "node"),
        ({"colour": "red"}, "colour"),
        ({"cluster": "x"}, "cluster"),
        ({"target_in_flight": -1}, "target_in_flight"),
        ({"target_in_flight": 100_001}, "target_in_flight"),
        ({"target_tokens_per_s": "fast"}, "target_tokens_per_s"),
        ({"target_tokens_per_s": 10_000_001}, "target_tokens_per_s"),
    ],
)
def test_endpoint_bad_input_is_400_with_field(api, cluster, node, body, field):
    payload = {"cluster": str(cluster.pk), "model_id": LLAMA.model_id, **body}
    response = api.post("/api/v1/endpoints/", payload, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()
    assert not Endpoint.objects.exists()


def test_endpoint_node_of_another_cluster_is_400(api, cluster, register_node, owner, workspace):
    from fleet import services

    second = services.cluster_create(actor=owner, workspace=workspace, name="second")
    elsewhere = register_node(second, "elsewhere")
    response = api.post(
        "/api/v1/endpoints/",
        {"cluster": str(cluster.pk), "model_id": LLAMA.model_id, "node": str(elsewhere.pk)},
        format="json",
    )
    assert response.status_code == 400
    assert "node" in response.json()


def test_endpoint_permissions_and_workspaces(api_client_for, cluster, node, owner, workspace, member_of, other_cluster):
    agent_side.inventory(node, models=[LLAMA])
    endpoint = workload_services.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id)
    viewer = api_client_for(member_of(workspace, "viewer"))
    assert viewer.get("/api/v1/endpoints/").json()["count"] == 1
    body = {"cluster": str(cluster.pk), "model_id": LLAMA.model_id}
    assert viewer.post("/api/v1/endpoints/", body, format="json").status_code == 403
    assert viewer.post(f"/api/v1/endpoints/{endpoint.pk}/stop/").status_code == 403
    stranger = api_client_for(other_cluster.workspace.memberships.get().user)
    assert stranger.get(f"/api/v1/endpoints/{endpoint.pk}/").status_code == 404
    assert stranger.post(f"/api/v1/endpoints/{endpoint.pk}/stop/").status_code == 404
    assert stranger.post("/api/v1/endpoints/", body, format="json").status_code == 404
    assert stranger.get("/api/v1/endpoints/").json()["count"] == 0
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.PENDING
    assert Endpoint.objects.count() == 1


def test_endpoint_list_query_count_is_constant(api, cluster, node, owner, django_assert_num_queries):
    agent_side.inventory(node, models=[LLAMA])
    workload_services.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id)
    with django_assert_num_queries(3):  # the count, the page, the page's replicas
        assert api.get("/api/v1/endpoints/").json()["count"] == 1
    for _ in range(6):
        workload_services.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id)
    with django_assert_num_queries(3):
        assert api.get("/api/v1/endpoints/").json()["count"] == 7


def test_endpoint_with_replicas_lists_them_with_node_state_and_in_flight(api, cluster, register_node, owner):
    for name in ("a", "b"):
        agent_side.inventory(register_node(cluster, name), models=[LLAMA])
    payload = {"cluster": str(cluster.pk), "model_id": LLAMA.model_id, "min_replicas": 2, "max_replicas": 3}
    response = api.post("/api/v1/endpoints/", payload, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["min_replicas"], body["max_replicas"]) == (2, 3)
    assert sorted(r["node_name"] for r in body["replicas"]) == ["a", "b"]
    assert {(r["status"], r["in_flight"]) for r in body["replicas"]} == {("pending", 0)}
    assert body["replicas"][0]["server_id"] == body["slug"]


@pytest.mark.parametrize(
    ("counts", "field"),
    [
        ({"min_replicas": -1}, "min_replicas"),
        ({"min_replicas": 2, "max_replicas": 1}, "max_replicas"),
        ({"min_replicas": 0, "max_replicas": 0}, "max_replicas"),
        ({"min_replicas": 0, "idle_timeout_s": 0}, "idle_timeout_s"),
    ],
)
def test_bad_replica_counts_are_a_400_naming_the_field(api, cluster, node, counts, field):
    agent_side.inventory(node, models=[LLAMA])
    payload = {"cluster": str(cluster.pk), "model_id": LLAMA.model_id, **counts}
    response = api.post("/api/v1/endpoints/", payload, format="json")
    assert response.status_code == 400
    assert field in response.json()
    assert not Endpoint.objects.exists()


def test_openapi_schema_describes_the_workload_api():
    from drf_spectacular.generators import SchemaGenerator

    from tests.fleet.workloads import workload_urls

    schema = SchemaGenerator(patterns=workload_urls.urlpatterns).get_schema(request=None, public=True)
    assert {"/api/v1/containers/", "/api/v1/models/", "/api/v1/endpoints/", "/api/v1/endpoints/{id}/stop/"} <= set(
        schema["paths"]
    )
    assert "/api/v1/endpoints/{id}/events/" in schema["paths"]
    post = schema["paths"]["/api/v1/endpoints/"]["post"]
    assert "EndpointCreate" in str(post["requestBody"])
    assert {"201", "409"} <= set(post["responses"])
    assert "error_help" in schema["components"]["schemas"]["Endpoint"]["properties"]


def test_replicas_show_the_load_shared_by_every_web_process_and_the_targets(api, cluster, register_node, owner):
    for name in ("a", "b"):
        agent_side.inventory(register_node(cluster, name), models=[LLAMA])
    payload = {"cluster": str(cluster.pk), "model_id": LLAMA.model_id, "min_replicas": 2, "max_replicas": 4}
    payload |= {"target_in_flight": 8, "target_tokens_per_s": 500}
    response = api.post("/api/v1/endpoints/", payload, format="json")
    assert response.status_code == 201, response.content
    assert (response.json()["target_in_flight"], response.json()["target_tokens_per_s"]) == (8, 500)
    first, second = EndpointReplica.objects.filter(endpoint_id=response.json()["id"]).order_by("created_at")
    a, b = LoadPublisher(name="test-a"), LoadPublisher(name="test-b")  # two web processes
    try:
        a.publish({first.server_id: (2, 300, 12.5)})
        b.publish({first.server_id: (1, 100, 2.5), second.server_id: (4, 0, 0.0)})
        replicas = {
            r["server_id"]: r for r in api.get(f"/api/v1/endpoints/{response.json()['id']}/").json()["replicas"]
        }
    finally:
        a.publish({})
        b.publish({})
    assert (replicas[first.server_id]["in_flight"], replicas[first.server_id]["tokens_per_s"]) == (3, 15.0)
    assert (replicas[second.server_id]["in_flight"], replicas[second.server_id]["tokens_per_s"]) == (4, 0.0)


def test_the_event_log_newest_first_to_members_only(
    api_client_for, cluster, node, owner, workspace, member_of, other_cluster
):
    agent_side.inventory(node, models=[LLAMA])
    endpoint = workload_services.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id)
    endpoint_event_record(endpoint=endpoint, kind="endpoint.scaled", message="scaled 1 → 2: why", data={"to": 2})
    viewer = api_client_for(member_of(workspace, "viewer"))
    page = viewer.get(f"/api/v1/endpoints/{endpoint.pk}/events/")
    assert page.status_code == 200
    body = page.json()
    assert body["count"] == 2
    assert [e["kind"] for e in body["results"]] == ["endpoint.scaled", "endpoint.starting"]
    assert body["results"][0]["message"] == "scaled 1 → 2: why"
    assert body["results"][0]["data"]["to"] == 2
    assert body["results"][1]["node_name"] == node.name
    stranger = api_client_for(other_cluster.workspace.memberships.get().user)
    assert stranger.get(f"/api/v1/endpoints/{endpoint.pk}/events/").status_code == 404

"""What /api/schema/ promises, checked against the server: the command dispatch body and answer per
command type, the error answers, paging bounds, and JSON for every /api/ URL (no HTML, no 500)."""

from __future__ import annotations

import pytest
from django.urls import reverse

from fleet import services
from fleet.api.examples import COMMAND_EXAMPLES
from fleet.models import Command, Node
from fleet.payloads import OWNED_COMMANDS, PAYLOAD_SERIALIZERS

pytestmark = pytest.mark.django_db

DISPATCH = "/api/v1/clusters/{id}/commands/"


@pytest.fixture
def schema(client, owner) -> dict:
    client.force_login(owner)
    response = client.get("/api/schema/?format=json")
    assert response.status_code == 200
    return response.json()


@pytest.fixture
def cluster(owner, workspace):
    cluster = services.cluster_create(actor=owner, workspace=workspace, name="contract")
    Node.objects.create(cluster=cluster, name="n1", hostname="n1", status="online", connected=False)
    return cluster


def _resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def test_command_dispatch_is_documented_per_command_type(schema):
    post = schema["paths"][DISPATCH]["post"]
    body = post["requestBody"]["content"]["application/json"]
    one_of = _resolve(schema, body["schema"])
    assert one_of["discriminator"]["propertyName"] == "command_type"
    # the ray.* types raymgr owns are sent by its own API only (refused here: tests/raymgr/test_owned_commands)
    assert set(one_of["discriminator"]["mapping"]) == set(PAYLOAD_SERIALIZERS) - set(OWNED_COMMANDS)
    create = _resolve(schema, {"$ref": one_of["discriminator"]["mapping"]["container.create"]})
    assert set(create["required"]) >= {"command_type", "payload"}
    payload = _resolve(schema, create["properties"]["payload"])
    assert set(payload["required"]) == {"image", "name"}
    assert "secret_fields" in payload["properties"]
    # one example per workload command type (the Ray types are sent by the Ray services)
    assert {e["value"]["command_type"] for e in body["examples"].values()} == set(COMMAND_EXAMPLES)
    assert set(COMMAND_EXAMPLES) == {t for t in PAYLOAD_SERIALIZERS if not t.startswith("ray.")}
    # the answer: 202 {batch_id, commands}, and every error the view gives
    assert set(post["responses"]) == {"202", "400", "403", "404", "409"}
    answer = _resolve(schema, post["responses"]["202"]["content"]["application/json"]["schema"])
    assert set(answer["properties"]) == {"batch_id", "commands"}
    assert _resolve(schema, post["responses"]["400"]["content"]["application/json"]["schema"])["type"] == "object"


def test_every_operation_documents_its_errors(schema):
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            codes = set(operation["responses"])
            assert "403" in codes, (method, path)
            if "{id}" in path:
                assert "404" in codes, (method, path)
            if "requestBody" in operation:
                assert "400" in codes, (method, path)
    register = schema["paths"]["/api/v1/agent/register"]["post"]
    assert {"201", "400", "403", "429"} <= set(register["responses"])
    assert "Retry-After" in register["responses"]["429"]["headers"]


@pytest.mark.parametrize("command_type", sorted(COMMAND_EXAMPLES))
def test_each_documented_example_is_accepted_as_it_stands(command_type, owner, cluster, api_client_for):
    response = api_client_for(owner).post(
        DISPATCH.format(id=cluster.pk),
        {"command_type": command_type, "node_id": None, "payload": COMMAND_EXAMPLES[command_type]},
        format="json",
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert [c["command_type"] for c in body["commands"]] == [command_type]
    assert Command.objects.filter(batch_id=body["batch_id"]).count() == 1


def test_bad_payload_fields_are_a_400_naming_them(owner, cluster, api_client_for):
    response = api_client_for(owner).post(
        DISPATCH.format(id=cluster.pk),
        {"command_type": "container.create", "payload": {"image": "x", "ports": "80", "bogus": 1}},
        format="json",
    )
    assert response.status_code == 400
    assert {"payload.name", "payload.ports", "payload.bogus"} <= set(response.json())


@pytest.mark.parametrize(
    "query",
    ["q=a%00b", "status=%00", "limit=99999999999999999999", "offset=99999999999999999999", "limit=0", "limit=x"],
)
def test_bad_query_values_are_a_400_not_a_500(owner, api_client_for, query):
    client = api_client_for(owner)
    for path in ("/api/v1/nodes/", "/api/v1/commands/", "/api/v1/audit/", "/api/v1/containers/"):
        response = client.get(f"{path}?{query}")
        assert response.status_code == 400, (path, query, response.content[:200])
        assert response["Content-Type"] == "application/json"
        name = query.split("=")[0]
        assert name in response.json(), response.json()


def test_paging_within_bounds_still_works(owner, api_client_for, cluster):
    client = api_client_for(owner)
    page = client.get("/api/v1/nodes/?limit=1000&offset=2147483647").json()
    assert (page["count"], page["results"]) == (1, [])
    assert client.get("/api/v1/nodes/?limit=&offset=").json()["count"] == 1


@pytest.mark.parametrize("method", ["get", "post", "delete"])
def test_unknown_api_urls_answer_a_json_404(owner, client, method):
    client.force_login(owner)
    for path in ("/api/v1/nope/", "/api/v1/clusters/not-a-uuid.x/", "/api/nothing", "/api/v1/clusters/1/nope/"):
        response = getattr(client, method)(path)
        assert response.status_code == 404, (method, path)
        assert response["Content-Type"] == "application/json"
        assert response.json() == {"detail": "Not found."}


def test_a_known_api_url_without_its_slash_still_redirects(owner, client):
    client.force_login(owner)
    response = client.get("/api/v1/workspaces?limit=5")
    assert response.status_code == 301
    assert response["Location"] == "/api/v1/workspaces/?limit=5"
    assert reverse("api-root") == "/api/v1/"

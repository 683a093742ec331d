"""The API answers as its schema says: schemathesis fuzzes every operation of /api/schema/ and checks
each answer — no 5xx, a documented status code, the documented content type and headers, and a body
that matches the documented schema for that status (errors included).

The schema is loaded from the running app's own `/api/schema/` (in-process WSGI, no network) and
every operation gets a bounded number of generated requests, sent once as generated and, for
operations on one object, once more with the id of a real object of the signed-in Owner's workspace
(so bodies and query strings are fuzzed against live rows, not only against 404s). Requests go with
the Owner's API token; a session-cookie client reads the same objects.

Also here: objects of another workspace are 404 on every detail route, for reads and writes alike.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from fleet import services
from fleet.models import Command, Node
from raymgr import services as ray_services

# ~60 operations x (examples + the real-id replay): about 45 CPU seconds; derandomized, so every run
# sends the same requests.
EXAMPLES_PER_OPERATION = 15
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
ID_PATH = re.compile(r"^/api/v1/(?P<resource>[a-z/]+?)/\{id\}/")


def _node(cluster, name: str) -> Node:
    node = Node.objects.create(cluster=cluster, name=name, hostname=name, status="online", connected=False)
    return node


def _world(owner, workspace) -> dict[str, str]:
    """One object of each kind in `workspace`; returns resource path → id."""
    cluster = services.cluster_create(actor=owner, workspace=workspace, name="fuzz")
    node = _node(cluster, "fuzz-node")
    (command,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}, node=node
    )
    namespace = services.namespace_create(actor=owner, workspace=workspace, name="fuzz-ns")
    ids = {
        "clusters": str(cluster.pk),
        "nodes": str(node.pk),
        "commands": str(command.pk),
        "namespaces": str(namespace.pk),
        "workspaces": str(workspace.pk),
    }
    ray = ray_services.ray_cluster_create(actor=owner, workspace=workspace, compute_cluster=cluster, name="fuzz-ray")
    ids["ray/clusters"] = str(ray.pk)
    return ids


@pytest.fixture
def fuzz_world(owner, workspace) -> dict[str, Any]:
    token = Token.objects.create(user=owner)
    return {"token": token.key, "ids": _world(owner, workspace), "owner": owner}


@pytest.fixture
def api_schema(fuzz_world):
    # Like Django's test client: the in-process requests must not close the test's DB connection.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    app = get_wsgi_application()
    yield schemathesis.openapi.from_wsgi(
        "/api/schema/?format=json", app, headers={"Authorization": f"Token {fuzz_world['token']}"}
    )
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def _fuzz_operation(operation, world: dict[str, Any], failures: list[str]) -> int:
    """Send bounded generated requests to one operation; record in `failures` every answer that breaks one
    of `CHECKS`; return how many requests were sent."""
    headers = {"Authorization": f"Token {world['token']}"}
    sent = 0

    @given(
        case=st.one_of(operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE))
    )
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: report the first failure and move on
        suppress_health_check=list(HealthCheck),
    )
    def run(case) -> None:
        nonlocal sent
        targets = [dict(case.path_parameters or {})]
        match = ID_PATH.match(operation.path)
        real_id = world["ids"].get(match["resource"]) if match else None
        if real_id and operation.method.upper() != "DELETE":
            targets.append({**targets[0], "id": real_id})
        for params in targets:
            case.path_parameters = params
            response = case.call(headers=headers)
            sent += 1
            try:
                case.validate_response(response, checks=CHECKS, headers=headers)
            except (AssertionError, FailureGroup) as exc:
                failures.append(
                    f"{case.method} {case.formatted_path} {case.query!r} -> {response.status_code}: "
                    f"{case.body!r} {response.text[:300]!r}\n{exc}"
                )

    try:
        run()
    except AssertionError:
        pass  # recorded; the other operations still run
    except Unsatisfiable:
        pass  # e.g. no way to make a negative case for an operation without inputs
    return sent


@pytest.mark.django_db
@pytest.mark.timeout(900)  # a bounded number of requests; only a loaded machine makes it slow
def test_every_operation_answers_as_its_schema_says(api_schema, fuzz_world):
    failures: list[str] = []
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 40
    sent = sum(_fuzz_operation(operation, fuzz_world, failures) for operation in operations)
    assert sent >= len(operations) * EXAMPLES_PER_OPERATION // 2
    assert not failures, "\n".join(failures)


@pytest.mark.django_db
def test_fuzz_reaches_real_objects_and_reads_with_a_session(fuzz_world, client):
    """The fixture objects are real (the replay above hits them) and session-cookie reads work too."""
    client.force_login(fuzz_world["owner"])
    for resource, pk in fuzz_world["ids"].items():
        response = client.get(f"/api/v1/{resource}/{pk}/")
        assert response.status_code == 200, (resource, response.content)


# --------------------------------------------------------------------------------------------------
# Cross-workspace ids


@pytest.mark.django_db
def test_objects_of_another_workspace_are_404_everywhere(owner, workspace, other_workspace):
    from django.contrib.auth import get_user_model

    mine = _world(owner, workspace)
    stranger = get_user_model().objects.get(username="globex-owner")
    theirs = _world(stranger, other_workspace)
    assert Command.objects.count() == 2
    client = APIClient()
    client.force_authenticate(owner)
    probes = {
        "clusters": [
            ("get", ""),
            ("patch", ""),
            ("put", ""),
            ("delete", ""),
            ("get", "commands/"),
            ("post", "commands/"),
            ("post", "join-tokens/"),
        ],
        "nodes": [
            ("get", ""),
            ("patch", ""),
            ("delete", ""),
            ("post", "cordon/"),
            ("post", "drain/"),
            ("post", "uncordon/"),
            ("get", "events/"),
        ],
        "commands": [("get", "")],
        "namespaces": [("get", ""), ("patch", ""), ("delete", "")],
        "workspaces": [("get", ""), ("get", "members/")],
        "ray/clusters": [
            ("get", ""),
            ("patch", ""),
            ("delete", ""),
            ("get", "events/"),
            ("get", "nodes/"),
            ("post", "start/"),
            ("post", "stop/"),
        ],
    }
    checked = 0
    for resource, calls in probes.items():
        if resource not in theirs:
            continue
        for method, suffix in calls:
            url = f"/api/v1/{resource}/{theirs[resource]}/{suffix}"
            response = getattr(client, method)(url, {"name": "x"}, format="json")
            assert response.status_code == 404, (method, url, response.status_code, response.content[:200])
            checked += 1
        assert client.get(f"/api/v1/{resource}/{mine[resource]}/").status_code == 200
    assert checked >= 25
    # a command naming a node of another workspace is refused without revealing it
    response = client.post(
        f"/api/v1/clusters/{mine['clusters']}/commands/",
        {"command_type": "model.download", "payload": {"model_id": "a/b"}, "node_id": theirs["nodes"]},
        format="json",
    )
    assert response.status_code in (400, 404), response.content
    assert Command.objects.filter(node_id=theirs["nodes"]).count() == 1
    # the other workspace's objects are untouched
    assert Node.objects.filter(pk=theirs["nodes"], status="online").exists()
    # list endpoints never show them
    listed = client.get("/api/v1/nodes/").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert theirs["nodes"] not in {row["id"] for row in rows}

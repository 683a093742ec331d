"""The command types raymgr owns (`ray.*`) are sent by raymgr's services only: the generic command API
(`POST /api/v1/clusters/<id>/commands/`) refuses them with a 400 naming the API that sends them, for one
node and for a fan-out, and writes nothing; raymgr's own services still send them."""

from __future__ import annotations

import pytest

from agent import protocol
from fleet.models import Command
from tests.raymgr.conftest import last_command

pytestmark = pytest.mark.django_db

HEAD = {
    "cluster_id": "c1",
    "member_id": "m1",
    "ray_version": "2.9.0",
    "image": "rayproject/ray:2.9.0",
    "runtime": "docker",
    "num_gpus": 8,
}
WORKER = {**HEAD, "head_address": "10.0.0.1:6380"}


@pytest.mark.parametrize(
    ("command_type", "payload", "names"),
    [
        ("ray.head.start", HEAD, "the Ray cluster API (POST /api/v1/ray/clusters/"),
        ("ray.worker.start", WORKER, "the Ray cluster API"),
        ("ray.node.stop", {"cluster_id": "c1", "member_id": "m1"}, "the Ray cluster API"),
        ("ray.job.submit", {"cluster_id": "c1", "member_id": "m1", "entrypoint": "x"}, "the Ray workload API"),
    ],
)
@pytest.mark.parametrize("to_every_node", [True, False])
def test_the_command_api_refuses_what_raymgr_owns(
    api_client_for, owner, compute, add_node, command_type, payload, names, to_every_node
):
    node = add_node(compute, "gpu-1", gpus=2)
    body = {"command_type": command_type, "payload": payload, "node_id": None if to_every_node else str(node.pk)}
    refused = api_client_for(owner).post(f"/api/v1/clusters/{compute.pk}/commands/", body, format="json")
    assert refused.status_code == 400, refused.content
    (message,) = refused.json()["command_type"]
    assert message.startswith(f"{command_type} is not sent through the command API: use {names}")
    assert not Command.objects.exists()


def test_every_ray_command_type_is_owned_and_left_out_of_the_command_schema(api_client_for, owner):
    from fleet import payloads

    assert set(protocol.RAY_NODE_COMMAND_TYPES) | set(protocol.RAY_JOB_COMMAND_TYPES) <= set(payloads.OWNED_COMMANDS)
    schema = api_client_for(owner).get("/api/schema/", {"format": "json"})
    assert schema.status_code == 200
    names = set(schema.json()["components"]["schemas"])
    assert "ContainerCreateCommand" in names
    assert not {n for n in names if n.startswith("Ray") and n.endswith("Command")}


def test_raymgrs_own_services_still_send_them(owner, compute, add_node, make_ray):
    add_node(compute, "head-1")
    ray = make_ray()
    head = last_command("ray.head.start", cluster_id=str(ray.pk))
    assert head is not None
    assert head.created_by == owner

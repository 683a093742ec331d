"""Rolling update of an endpoint to another revision: new replicas start beside the old ones, which serve
until each replacement runs, then leave rotation and stop after the drain time; refusals write nothing."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from agent import protocol
from fleet.models import Command
from fleet.proxy import endpoint_routes
from fleet.workloads import services as workloads
from fleet.workloads.models import EndpointReplica, EndpointStatus
from fleet.workloads.services import PlacementError
from fleet.workloads.tasks import endpoints_heal_tick
from kernel.exceptions import IllegalTransition
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db

MAIN = protocol.CachedModel(model_id="acme/tiny", revision="main", path="/cache/main", size_bytes=5)
V2 = protocol.CachedModel(model_id="acme/tiny", revision="v2", path="/cache/v2", size_bytes=5)


def in_rotation(endpoint) -> set[str]:
    endpoint_routes.forget_routes()
    return {u.key for u in endpoint_routes._load_route(endpoint.slug).replicas}


@pytest.fixture
def running(cluster, register_node, owner):
    for name in ("a", "b"):
        agent_side.inventory(register_node(cluster, name), models=[MAIN, V2])
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id="acme/tiny", min_replicas=2)
    for port, replica in enumerate(EndpointReplica.objects.filter(endpoint=endpoint), start=8001):
        agent_side.result(replica.start_command, port=port)
    endpoint.refresh_from_db()
    return endpoint


def test_new_replicas_take_over_before_the_old_ones_stop(running, owner, settings):
    settings.ENDPOINT_DRAIN_S = 3600
    olds = list(EndpointReplica.objects.filter(endpoint=running))
    endpoint = workloads.endpoint_update(actor=owner, endpoint=running, revision="v2")
    assert (endpoint.revision, endpoint.status) == ("v2", EndpointStatus.RUNNING)  # the old ones still serve
    news = [EndpointReplica.objects.get(replacement_of=old) for old in olds]
    assert [n.start_command.payload["revision"] for n in news] == ["v2", "v2"]
    assert len({n.node_id for n in news}) == 2
    assert in_rotation(endpoint) == {o.server_id for o in olds}

    agent_side.result(news[0].start_command, port=9001)  # the first new one passed its readiness check
    assert in_rotation(endpoint) == {olds[1].server_id, news[0].server_id}
    assert endpoints_heal_tick() == {str(endpoint.pk): 0}  # draining: nothing stops yet
    assert EndpointReplica.objects.get(pk=olds[0].pk).status == EndpointStatus.RUNNING
    agent_side.result(news[1].start_command, port=9002)
    assert in_rotation(endpoint) == {n.server_id for n in news}

    settings.ENDPOINT_DRAIN_S = 0
    endpoints_heal_tick()
    stopping = EndpointReplica.objects.filter(pk__in=[o.pk for o in olds], status=EndpointStatus.STOPPING)
    assert stopping.count() == 2
    for old in stopping:
        agent_side.result(old.stop_command)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.RUNNING
    assert in_rotation(endpoint) == {n.server_id for n in news}
    assert endpoints_heal_tick() == {}


def test_refusals_write_nothing(running, owner, cluster, register_node):
    starts = Command.objects.filter(command_type="endpoint.start").count()
    with pytest.raises(IllegalTransition, match="already"):
        workloads.endpoint_update(actor=owner, endpoint=running, revision="main")
    with pytest.raises(ValidationError):
        workloads.endpoint_update(actor=owner, endpoint=running, revision="../x")
    with pytest.raises(PlacementError):
        workloads.endpoint_update(actor=owner, endpoint=running, revision="v3")  # cached nowhere
    running.refresh_from_db()
    assert running.revision == "main"
    assert Command.objects.filter(command_type="endpoint.start").count() == starts
    workloads.endpoint_stop(actor=owner, endpoint=running)
    with pytest.raises(IllegalTransition, match="only a running one"):
        workloads.endpoint_update(actor=owner, endpoint=running, revision="v2")


def test_the_api_rolls_an_endpoint_over(running, api_client_for, owner):
    response = api_client_for(owner).post(
        f"/api/v1/endpoints/{running.pk}/update_revision/", {"revision": "v2"}, format="json"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["revision"] == "v2"
    assert sum(1 for r in body["replicas"] if r["replacement_of"]) == 2
    bad = api_client_for(owner).post(f"/api/v1/endpoints/{running.pk}/update_revision/", {}, format="json")
    assert bad.status_code == 400
    assert "revision" in bad.json()

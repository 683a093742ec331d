"""Budgets' hard stops across two real web replicas: the minute's evaluation stops a key (and a workspace) on
both at once, with a 429 and a JSON reason naming the budget, and raising the limit lets them through again.

The endpoint's node is offline, so an admitted request is answered 502 by the proxy (after the key, its rate
limits and the budgets were checked) and a stopped one 429: no agent is needed to tell them apart. The
month's usage is written as the replicas' meters flush it (one upsert of hour rollups).
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import redis
import requests
from django.conf import settings as django_settings

from fleet import origin_names
from fleet.usage import budget_stops, budgets, services
from fleet.workloads import services as workload_services
from fleet.workloads.models import Endpoint, EndpointStatus
from tests.support.endpoints import endpoint_row
from tests.support.live import ControlPlane, subprocess_env
from tests.support.processes import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

CACHE_S = 0.5


@pytest.fixture
def replicas(tmp_path):
    plane = ControlPlane(log_dir=tmp_path, env=subprocess_env(BUDGET_STOPS_CACHE_S=str(CACHE_S)))
    plane.start_replica()
    plane.start_replica()
    yield plane
    plane.stop()
    redis.Redis.from_url(django_settings.REDIS_URL).delete(budget_stops.KEY)


@pytest.fixture
def endpoint(cluster, register_node) -> Endpoint:
    node = register_node(cluster, online=False)
    return endpoint_row(cluster=cluster, node=node, model_id="org/m", status=EndpointStatus.RUNNING, port=81)


def invoke(plane: ControlPlane, replica: int, endpoint: Endpoint, raw: str) -> requests.Response:
    return requests.post(
        f"http://127.0.0.1:{plane.ports[replica]}/v1/chat/completions",
        headers={"Host": origin_names.ENDPOINT.host(endpoint.slug), "Authorization": f"Bearer {raw}"},
        json={"messages": []},
        timeout=10,
    )


def metered(workspace, endpoint, key_id: int, tokens: int) -> None:
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    services.usage_add(
        rows=[
            services.Rollup("hour", hour, workspace.pk, "endpoint", endpoint.pk, key_id, 1, 0, tokens, 0),
        ]
    )


def answers(plane, endpoint, raw) -> list[int]:
    return [invoke(plane, replica, endpoint, raw).status_code for replica in (0, 1)]


def test_a_hard_stop_is_in_force_on_both_replicas_and_lifts_when_raised(replicas, endpoint, owner, workspace):
    key, raw = workload_services.api_key_create(actor=owner, workspace=workspace, name="k", scopes=["invoke"])
    _, other = workload_services.api_key_create(actor=owner, workspace=workspace, name="o", scopes=["invoke"])
    budgets.budget_set(actor=owner, workspace=workspace, api_key=key, token_limit=1000, hard_stop=True)
    assert answers(replicas, endpoint, raw) == [502, 502], replicas.logs()
    metered(workspace, endpoint, key.pk, 600)  # what one replica's meter flushed
    metered(workspace, endpoint, key.pk, 400)  # ... and the other's
    assert budgets.budgets_evaluate() == 1  # the end of the minute
    wait_until(lambda: answers(replicas, endpoint, raw) == [429, 429], timeout=CACHE_S + 10, what="both replicas stop")
    refused = invoke(replicas, 1, endpoint, raw)
    error = refused.json()["error"]
    assert (error["type"], error["budget"], error["token_limit"]) == (
        "budget_exceeded",
        f"the monthly budget of API key {key.pk}",
        1000,
    )
    assert "is used up (tokens 100%)" in error["message"]
    assert answers(replicas, endpoint, other) == [502, 502]  # another key of the workspace goes on

    budgets.budget_set(actor=owner, workspace=workspace, token_limit=500, hard_stop=True)  # the workspace's
    budgets.budgets_evaluate()
    wait_until(lambda: answers(replicas, endpoint, other) == [429, 429], timeout=CACHE_S + 10, what="workspace stop")
    assert invoke(replicas, 0, endpoint, other).json()["error"]["budget"] == "the workspace's monthly budget"

    budgets.budget_set(actor=owner, workspace=workspace, token_limit=10_000, hard_stop=True)
    budgets.budget_set(actor=owner, workspace=workspace, api_key=key, token_limit=2000, hard_stop=True)
    assert budgets.budgets_evaluate() == 0
    wait_until(
        lambda: answers(replicas, endpoint, raw) == [502, 502] and answers(replicas, endpoint, other) == [502, 502],
        timeout=CACHE_S + 10,
        what="both replicas let the raised budgets through",
    )

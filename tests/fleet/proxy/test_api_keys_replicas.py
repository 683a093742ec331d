"""API keys across two real web replicas: a revocation made through one is in force on the other, and
a key's requests-per-minute limit counts the requests both replicas admitted.

The endpoint's node is offline, so an admitted request is answered 502 by the proxy (after the key and
its limit were checked) and a refused one 401 or 429: no agent is needed to tell them apart.
"""

from __future__ import annotations

import time

import pytest
import redis
import requests
from django.conf import settings as django_settings
from rest_framework.authtoken.models import Token

from fleet import origin_names
from fleet.proxy import rate_limits
from fleet.workloads import services as workload_services
from fleet.workloads.models import Endpoint, EndpointStatus
from tests.support.endpoints import endpoint_row
from tests.support.live import ControlPlane, subprocess_env
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

CACHE_S = 0.5


@pytest.fixture
def replicas(tmp_path):
    plane = ControlPlane(log_dir=tmp_path, env=subprocess_env(API_KEY_CACHE_S=str(CACHE_S)))
    plane.start_replica()
    plane.start_replica()
    yield plane
    plane.stop()
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    for key in client.scan_iter(match=f"{rate_limits.PREFIX}*"):
        client.delete(key)


@pytest.fixture
def endpoint(cluster, register_node) -> Endpoint:
    node = register_node(cluster, online=False)
    return endpoint_row(cluster=cluster, node=node, model_id="org/m", status=EndpointStatus.RUNNING, port=81)


def invoke(plane: ControlPlane, replica: int, endpoint: Endpoint, raw: str) -> requests.Response:
    host = origin_names.ENDPOINT.host(endpoint.slug)
    return requests.post(
        f"http://127.0.0.1:{plane.ports[replica]}/v1/chat/completions",
        headers={"Host": host, "Authorization": f"Bearer {raw}"},
        json={"messages": []},
        timeout=10,
    )


def api(plane: ControlPlane, replica: int, method: str, path: str, auth: str) -> requests.Response:
    return requests.request(
        method, f"http://127.0.0.1:{plane.ports[replica]}{path}", headers={"Authorization": auth}, timeout=10
    )


def test_a_key_revoked_through_one_replica_is_refused_by_the_other(replicas, endpoint, owner, workspace):
    key, raw = workload_services.api_key_create(actor=owner, workspace=workspace, name="k", scopes=["read", "invoke"])
    token = Token.objects.create(user=owner).key
    # replica 1 has the key in its cache, for the API and the endpoint origin
    assert api(replicas, 1, "GET", "/api/v1/clusters/", f"Bearer {raw}").status_code == 200
    assert invoke(replicas, 1, endpoint, raw).status_code == 502, replicas.logs()
    assert api(replicas, 0, "DELETE", f"/api/v1/api-keys/{key.pk}/", f"Token {token}").status_code == 204
    wait_until(
        lambda: (
            invoke(replicas, 1, endpoint, raw).status_code == 401
            and api(replicas, 1, "GET", "/api/v1/clusters/", f"Bearer {raw}").status_code in (401, 403)
        ),
        timeout=CACHE_S + 5,  # in force within API_KEY_CACHE_S; the rest is slack for a busy 2-core machine
        what="the other replica refusing the revoked key",
    )


def test_the_requests_per_minute_limit_spans_replicas(replicas, endpoint, owner, workspace):
    _, raw = workload_services.api_key_create(
        actor=owner, workspace=workspace, name="k", scopes=["invoke"], requests_per_min=4
    )
    wait_until(lambda: time.time() % 60 < 40, timeout=25, what="a minute's window with time to spare")
    answers = [invoke(replicas, i % 2, endpoint, raw).status_code for i in range(4)]
    assert answers == [502] * 4, replicas.logs()
    for replica in (0, 1):
        refused = invoke(replicas, replica, endpoint, raw)
        assert refused.status_code == 429
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert refused.json()["error"]["type"] == "rate_limited"

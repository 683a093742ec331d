"""Endpoint routing for the tunnel proxy: cached routes, what invalidates them, credentials every time."""

from __future__ import annotations

import asyncio

import pytest
from rest_framework.authtoken.models import Token

from fleet import origin_names
from fleet.admission import QueuePolicy
from fleet.balancer import Upstream
from fleet.models import NodeStatus
from fleet.proxy import endpoint_routes
from fleet.proxy.resolvers import ProxyRefusal, ProxyTarget
from fleet.usage.meter import Subject
from fleet.workloads.models import Endpoint, EndpointStatus
from kernel import timeseries
from tests.support.endpoints import endpoint_row

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _empty_route_cache():
    endpoint_routes.forget_routes()
    yield
    endpoint_routes.forget_routes()


@pytest.fixture
def endpoint(cluster, node) -> Endpoint:
    return endpoint_row(
        cluster=cluster, node=node, model_id="org/m", status=EndpointStatus.RUNNING, port=8123, public=True
    )


def scope(slug: str, token: str = "") -> dict:
    """A request on the endpoint's own origin."""
    headers = [(b"host", f"{origin_names.ENDPOINT.host(slug)}:8000".encode())]
    if token:
        headers.append((b"authorization", f"Token {token}".encode()))
    return {"type": "http", "path": "/v1/models", "query_string": b"a=1", "headers": headers}


def decide(request_scope: dict):
    """The resolver's answer, computed on this thread (so the query counts see it)."""
    return endpoint_routes._decide(request_scope, *endpoint_routes._slug_and_path(request_scope))


def test_a_cached_public_route_costs_no_query(endpoint, node, django_assert_num_queries):
    first = decide(scope(endpoint.slug))
    assert first == ProxyTarget(
        node_id=node.pk,
        port=8123,
        path="/v1/models?a=1",
        node_online=True,
        meter=timeseries.workspace_series(endpoint.cluster.workspace_id),  # its requests count there
        usage=Subject(endpoint.cluster.workspace_id, endpoint.pk),  # and its usage (fleet.usage)
        replicas=(Upstream(endpoint.slug, node.pk, 8123),),  # balanced over its running replica(s)
        # vLLM's default limit, the queue's defaults (through a cold start: ENDPOINT_COLD_START_S, the longer)
        queue=QueuePolicy(str(endpoint.pk), limit=256, depth=1024, wait_s=60.0, cold_wait_s=300.0),
    )
    with django_assert_num_queries(0):
        assert decide(scope(endpoint.slug)) == first


def test_the_async_resolver_answers_from_the_cache_without_a_thread_hop(endpoint, monkeypatch):
    decide(scope(endpoint.slug))  # warm the cache

    def no_database(*args, **kwargs):
        raise AssertionError("the database was consulted")

    monkeypatch.setattr(endpoint_routes, "_decide", no_database)
    answer = asyncio.run(endpoint_routes.resolve_endpoint(scope(endpoint.slug)))
    assert isinstance(answer, ProxyTarget)
    assert answer.port == 8123


def test_saving_the_endpoint_or_its_node_in_this_process_is_seen_at_once(endpoint, node):
    decide(scope(endpoint.slug))
    endpoint.public = False
    endpoint.save()
    assert decide(scope(endpoint.slug)) == ProxyRefusal(401, endpoint_proxy_message())
    endpoint.public = True
    endpoint.save()
    assert isinstance(decide(scope(endpoint.slug)), ProxyTarget)
    node.status = NodeStatus.OFFLINE
    node.save()
    assert decide(scope(endpoint.slug)).node_online is False
    endpoint.delete()
    assert decide(scope(endpoint.slug)) == ProxyRefusal(404, "No such endpoint.")


def test_a_change_made_elsewhere_is_seen_once_the_route_expires(endpoint, settings, monkeypatch):
    settings.PROXY_ROUTE_CACHE_S = 2.0
    clock = [1000.0]
    monkeypatch.setattr(endpoint_routes.time, "monotonic", lambda: clock[0])
    decide(scope(endpoint.slug))
    Endpoint.objects.filter(pk=endpoint.pk).update(status=EndpointStatus.STOPPED)  # no signal: "another process"
    clock[0] += 1.9
    assert isinstance(decide(scope(endpoint.slug)), ProxyTarget)
    clock[0] += 0.2
    assert decide(scope(endpoint.slug)) == ProxyRefusal(503, "Endpoint is stopped, not running.")


def test_zero_turns_the_cache_off(endpoint, settings, django_assert_num_queries):
    settings.PROXY_ROUTE_CACHE_S = 0
    decide(scope(endpoint.slug))
    with django_assert_num_queries(2):  # the endpoint, its running replicas
        decide(scope(endpoint.slug))


def test_credentials_of_a_private_endpoint_are_checked_on_every_request(endpoint, owner, make_user):
    Endpoint.objects.filter(pk=endpoint.pk).update(public=False)
    token = Token.objects.create(user=owner).key
    stranger = Token.objects.create(user=make_user("stranger")).key
    assert isinstance(decide(scope(endpoint.slug, token)), ProxyTarget)
    # the route is cached now; the next callers are still judged one by one
    assert decide(scope(endpoint.slug)) == ProxyRefusal(401, endpoint_proxy_message())
    assert decide(scope(endpoint.slug, stranger)) == ProxyRefusal(404, "No such endpoint.")
    Token.objects.filter(key=token).delete()
    assert decide(scope(endpoint.slug, token)) == ProxyRefusal(401, endpoint_proxy_message())


def test_unknown_slugs_are_not_cached(db):
    assert decide(scope("0" * 12)) == ProxyRefusal(404, "No such endpoint.")
    assert endpoint_routes._routes == {}


def endpoint_proxy_message() -> str:
    return endpoint_routes.UNAUTHENTICATED


def resolve_and_write(request_scope: dict):
    """Resolve one request, then let the count it wrote aside (the request does not wait for it) land."""

    async def both():
        answer = await endpoint_routes.resolve_endpoint(request_scope)
        await asyncio.gather(*endpoint_routes._writes)
        return answer

    return asyncio.run(both())


@pytest.mark.django_db(transaction=True)
def test_forwarded_requests_are_counted_with_the_last_request_time(endpoint, settings):
    endpoint_routes._unwritten.clear()
    endpoint_routes._written_at.clear()
    settings.ENDPOINT_REQUESTS_FLUSH_S = 3600
    for _ in range(3):
        assert isinstance(resolve_and_write(scope(endpoint.slug)), ProxyTarget)
    endpoint.refresh_from_db()
    # the first request of a quiet endpoint is written at once, the next ones wait for the interval
    assert endpoint.request_count == 1
    assert endpoint.last_request_at is not None
    settings.ENDPOINT_REQUESTS_FLUSH_S = 0
    resolve_and_write(scope(endpoint.slug))
    endpoint.refresh_from_db()
    assert endpoint.request_count == 4
    # refused requests (not forwarded) do not count
    Endpoint.objects.filter(pk=endpoint.pk).update(status=EndpointStatus.STOPPED)
    endpoint_routes.forget_routes()
    assert isinstance(resolve_and_write(scope(endpoint.slug)), ProxyRefusal)
    assert Endpoint.objects.get(pk=endpoint.pk).request_count == 4

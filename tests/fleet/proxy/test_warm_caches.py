"""The proxy's copies of keys, routes and budget stops kept fresh off the request path (`fleet.proxy.warm_caches`).

A caller sending one request every few seconds used to find its key (cached 0.5 s), its endpoint's route
(2 s) and the budget stops (5 s) stale on every request, and waited for a thread hop and the queries each
time: the proxy's overhead at one request at a time (issue #45). The caches' times are shortened here so the
tests need not wait seconds.
"""

from __future__ import annotations

import asyncio

import pytest
from django.utils import timezone

from fleet.proxy import endpoint_routes, warm_caches
from fleet.proxy.resolvers import ProxyRefusal, ProxyTarget
from fleet.usage import budget_stops
from fleet.workloads import services as workload_services
from fleet.workloads.models import Endpoint, EndpointStatus
from tenancy import api_keys
from tenancy.models import ApiKey
from tests.fleet.proxy.test_endpoint_keys import scope
from tests.support.endpoints import endpoint_row

pytestmark = pytest.mark.django_db(transaction=True)  # the resolver and the refresher read from threads

TTL_S = 1.0  # (a refresh must land within half of it, on a loaded test machine too)
PAUSE_S = 2.5 * TTL_S  # a caller's pause between two requests: every copy is past its time


@pytest.fixture(autouse=True)
def _short_caches(settings):
    settings.API_KEY_CACHE_S = TTL_S
    settings.PROXY_ROUTE_CACHE_S = TTL_S
    settings.BUDGET_STOPS_CACHE_S = TTL_S
    settings.PROXY_KEEP_WARM_S = 60.0
    endpoint_routes.forget_routes()
    api_keys.forget_grants()
    budget_stops.forget()
    yield
    endpoint_routes.forget_routes()
    api_keys.forget_grants()
    budget_stops.forget()
    for kind in (endpoint_routes._WARM_ROUTES, endpoint_routes._WARM_KEYS, endpoint_routes._WARM_STOPS):
        kind.used.clear()


@pytest.fixture
def endpoint(cluster, node) -> Endpoint:
    return endpoint_row(cluster=cluster, node=node, model_id="org/m", status=EndpointStatus.RUNNING, port=81)


@pytest.fixture
def raw_key(owner, workspace) -> str:
    return workload_services.api_key_create(actor=owner, workspace=workspace, name="k", scopes=["invoke"])[1]


class _RequestPath:
    """What one request waited for: thread hops (each a database read or write) and budget-stop reloads."""

    def __init__(self, monkeypatch) -> None:
        self.hops: list[str] = []
        self.stop_reloads = 0
        hop = endpoint_routes.database_sync_to_async
        reload = budget_stops._reload

        def counted_hop(function):
            self.hops.append(getattr(function, "__name__", repr(function)))
            return hop(function)

        async def counted_reload() -> None:
            self.stop_reloads += 1
            await reload()

        monkeypatch.setattr(endpoint_routes, "database_sync_to_async", counted_hop)
        monkeypatch.setattr(budget_stops, "_reload", counted_reload)


def test_a_request_after_a_pause_waits_for_no_query(endpoint, raw_key, monkeypatch):
    async def scenario() -> tuple[object, _RequestPath]:
        first = await endpoint_routes.resolve_endpoint(scope(endpoint, raw_key))
        assert isinstance(first, ProxyTarget)
        await asyncio.sleep(PAUSE_S)  # the caller reads, types (the refresher runs meanwhile)
        path = _RequestPath(monkeypatch)
        return await endpoint_routes.resolve_endpoint(scope(endpoint, raw_key)), path

    answer, path = asyncio.run(scenario())
    assert isinstance(answer, ProxyTarget)
    assert path.hops == []  # neither the route, nor the key, nor a write
    assert path.stop_reloads == 0


def test_a_key_revoked_elsewhere_is_still_refused_within_its_cache_time(endpoint, raw_key, monkeypatch):
    async def scenario() -> tuple[object, _RequestPath]:
        assert isinstance(await endpoint_routes.resolve_endpoint(scope(endpoint, raw_key)), ProxyTarget)
        # revoked through another replica: this process is not told, its copy is re-read
        await asyncio.to_thread(ApiKey.objects.update, revoked_at=timezone.now())
        await asyncio.sleep(PAUSE_S)
        path = _RequestPath(monkeypatch)
        return await endpoint_routes.resolve_endpoint(scope(endpoint, raw_key)), path

    answer, path = asyncio.run(scenario())
    assert answer == ProxyRefusal(401, endpoint_routes.BAD_KEY)
    assert path.hops == []  # the refresher had read the revocation


def test_a_route_change_made_elsewhere_is_seen_and_a_deleted_endpoint_forgotten(endpoint, raw_key):
    async def scenario() -> tuple[object, object]:
        assert isinstance(await endpoint_routes.resolve_endpoint(scope(endpoint, raw_key)), ProxyTarget)
        await asyncio.to_thread(Endpoint.objects.filter(pk=endpoint.pk).update, status=EndpointStatus.STOPPED)
        await asyncio.sleep(PAUSE_S)
        stopped = await endpoint_routes.resolve_endpoint(scope(endpoint, raw_key))
        await asyncio.to_thread(Endpoint.objects.filter(pk=endpoint.pk).delete)
        await asyncio.sleep(PAUSE_S)
        return stopped, endpoint_routes._routes.get(endpoint.slug)

    stopped, cached = asyncio.run(scenario())
    assert isinstance(stopped, ProxyRefusal)
    assert stopped.status == 503
    assert cached is None


def test_what_no_request_used_for_a_while_is_no_longer_read(settings):
    reads: list[list[str]] = []
    kind = warm_caches.Warmed("things", lambda: TTL_S, lambda name: 10.0, reload=reads.append)
    kind.used.update({"recent": 1000.0, "old": 1000.0 - settings.PROXY_KEEP_WARM_S - 1})
    assert kind.due(1000.0) == ["recent"]
    assert list(kind.used) == ["recent"]
    assert kind.due(1000.0 + settings.PROXY_KEEP_WARM_S + 1) == []
    assert kind.used == {}


def test_nothing_is_kept_warm_when_turned_off(settings, endpoint, raw_key):
    settings.PROXY_KEEP_WARM_S = 0

    async def scenario() -> None:
        await endpoint_routes.resolve_endpoint(scope(endpoint, raw_key))

    asyncio.run(scenario())
    assert endpoint_routes._WARM_ROUTES.used == {}
    assert endpoint_routes._WARM_KEYS.used == {}

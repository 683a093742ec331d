"""The proxy decides where an endpoint's request goes without the one sync thread the pages, the API and
`/healthz` share (`fleet.proxy.endpoint_routes.database_sync_to_async`): while that thread is busy, a request
is still routed. In a roll of 1,000 agents with 256 streams, route reloads queued on that thread made
`/healthz` miss HAProxy's 2 s check, and both new replicas were taken out (bench/web_roll.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async

from fleet import origin_names
from fleet.proxy import endpoint_routes
from fleet.proxy.resolvers import ProxyRefusal


@pytest.fixture(autouse=True)
def _fresh():
    endpoint_routes.forget_routes()
    yield
    endpoint_routes.forget_routes()


@pytest.mark.asyncio
async def test_a_request_is_routed_while_the_shared_sync_thread_is_busy(monkeypatch):
    loaded: list[str] = []

    def load_route(slug: str) -> None:  # (an endpoint that does not exist: no database needed)
        loaded.append(threading.current_thread().name)
        return None

    monkeypatch.setattr(endpoint_routes, "_load_route", load_route)
    release = threading.Event()
    busy = asyncio.ensure_future(sync_to_async(release.wait, thread_sensitive=True)(30))  # a slow page, say
    try:
        await asyncio.sleep(0.1)  # the shared thread is taken
        host = f"{origin_names.ENDPOINT.host('ab' * 6)}:8000".encode()
        scope = {"type": "http", "path": "/v1/models", "query_string": b"", "headers": [(b"host", host)]}
        answer = await asyncio.wait_for(endpoint_routes.resolve_endpoint(scope), timeout=10)
        assert isinstance(answer, ProxyRefusal)
        assert answer.status == 404
        assert len(loaded) == 1
        assert not busy.done()  # it was answered while the shared thread was still busy
    finally:
        release.set()
        await busy

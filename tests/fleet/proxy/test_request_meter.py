"""Endpoint requests and latency counted per workspace and minute as the proxy answers them."""

from __future__ import annotations

import asyncio
import functools

import pytest

from fleet import origin_names
from fleet.models import NodeStatus
from fleet.proxy import endpoint_routes, request_meter
from fleet.proxy.relay import TunnelProxyApp
from fleet.proxy.write_pressure import WritePressure
from fleet.workloads.models import EndpointStatus
from kernel import redis_client, timeseries
from tests.support.endpoints import endpoint_row

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def clean():
    endpoint_routes.forget_routes()
    request_meter.flush()
    client = redis_client.redis_client()
    yield
    endpoint_routes.forget_routes()
    keys = list(client.scan_iter(match=f"{timeseries.KEY_PREFIX}*"))
    if keys:
        client.delete(*keys)


def _now(series: str) -> dict[str, float]:
    return timeseries.read([series])[series][-1]


async def _answer(status: int, delay: float, send) -> None:
    await asyncio.sleep(delay)
    await send({"type": "http.response.start", "status": status, "headers": []})
    await asyncio.sleep(delay)  # the body's time is not latency: the head's is
    await send({"type": "http.response.body", "body": b"x"})


def test_metered_requests_count_status_and_time_to_first_byte(settings):
    settings.ENDPOINT_REQUESTS_FLUSH_S = 0.05
    sent = []

    async def send(message):
        sent.append(message["type"])

    async def main():
        await request_meter.metered("ws:a", send, functools.partial(_answer, 200, 0.02))
        await request_meter.metered("ws:a", send, functools.partial(_answer, 503, 0.0))
        await request_meter.metered("", send, functools.partial(_answer, 200, 0.0))  # not metered
        await asyncio.sleep(0.3)  # one flush, on a thread, after the interval

    asyncio.run(main())
    assert sent == ["http.response.start", "http.response.body"] * 3  # passed through unchanged
    counted = _now("ws:a")
    assert (counted["ep.requests"], counted["ep.errors"]) == (2, 1)
    assert 20 <= counted["ep.latency_ms_max"] < 40
    assert counted["ep.latency_ms_sum"] >= counted["ep.latency_ms_max"]


def test_a_burst_is_noted_in_memory_and_written_once(settings):
    settings.ENDPOINT_REQUESTS_FLUSH_S = 60
    writes = []
    original = timeseries.record

    def record(batch, **kwargs):
        writes.append(len(batch))
        original(batch, **kwargs)

    async def main():
        for _ in range(50):
            request_meter.observe("ws:b", 200, 0.01)

    asyncio.run(main())
    assert writes == []  # nothing written during the burst
    timeseries.record = record
    try:
        assert request_meter.flush() == 1  # one bucket, one Redis call
    finally:
        timeseries.record = original
    assert writes == [4]
    assert _now("ws:b")["ep.requests"] == 50


def test_the_meter_looks_through_to_daphnes_send_for_write_pressure():
    class Request:
        channel = object()
        producer = None

        def registerProducer(self, producer, streaming):
            self.producer = producer

    request = Request()
    daphne_send = functools.partial(lambda req, message: None, request)
    assert WritePressure.of(request_meter.MeteredSend(daphne_send))._request is request


@pytest.mark.django_db(transaction=True)  # the resolver reads the endpoint on another thread
def test_a_request_to_an_endpoint_whose_node_is_offline_counts_as_an_error(cluster, node, settings):
    settings.ENDPOINT_REQUESTS_FLUSH_S = 0.05
    endpoint = endpoint_row(
        cluster=cluster, node=node, model_id="org/m", status=EndpointStatus.RUNNING, port=8123, public=True
    )
    node.status = NodeStatus.OFFLINE
    node.save()
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/v1/models",
        "query_string": b"",
        "headers": [(b"host", f"{origin_names.ENDPOINT.host(endpoint.slug)}:8000".encode())],
    }
    statuses = []

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def inner(scope, receive, send):
        raise AssertionError("an endpoint's request reached Django")

    async def main():
        await TunnelProxyApp(inner)(scope, receive, send)
        await asyncio.sleep(0.3)

    asyncio.run(main())
    assert statuses == [502]
    counted = _now(timeseries.workspace_series(cluster.workspace_id))
    assert (counted["ep.requests"], counted["ep.errors"]) == (1, 1)

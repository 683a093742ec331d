"""The relay meters endpoint requests as their answers go by: tokens, API key, cut streams as errors.

The node is a small stand-in tunnel in this process that answers each stream with canned HTTP bytes
(the real agent and server: tests/e2e/test_endpoints.py); the proxy, the meter and the database are real.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from fleet import origin_names
from fleet.proxy import endpoint_routes
from fleet.proxy.relay import TunnelProxyApp
from fleet.tunnel import local_tunnels
from fleet.usage import meter
from fleet.usage.models import UsageRollup
from fleet.workloads.models import EndpointStatus
from kernel.asgi_scope import API_KEY_ID_SCOPE_KEY
from tests.support.endpoints import endpoint_row

pytestmark = pytest.mark.django_db(transaction=True)  # the resolver reads the endpoint on another thread


class CannedTunnel:
    """Answers every stream with `chunks` of raw HTTP response bytes, then ends it (with `error`)."""

    def __init__(self, chunks: list[bytes], error: str = "") -> None:
        self.chunks, self.error = chunks, error
        self.request = b""  # the request bytes the node got (head and body, when they came whole)

    async def node_command(self, message):  # pragma: no cover - not used
        pass

    async def open_local_stream(self, stream, opening) -> None:
        self.request = opening["data"]

        async def answer():
            for chunk in self.chunks:
                await asyncio.sleep(0)
                stream.deliver({"type": "stream.data", "data": chunk})
            stream.deliver({"type": "stream.end", "error": self.error})

        asyncio.get_running_loop().create_task(answer())

    async def stream_message(self, message) -> None:
        pass


@pytest.fixture
def endpoint(cluster, node):
    endpoint_routes.forget_routes()
    yield endpoint_row(
        cluster=cluster, node=node, model_id="org/m", status=EndpointStatus.RUNNING, port=8123, public=True
    )
    endpoint_routes.forget_routes()


def _request(endpoint, tunnel, key_id=None, body: bytes = b"{}", chunked: bool = False) -> list[dict]:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "query_string": b"",
        "headers": [
            (b"host", f"{origin_names.ENDPOINT.host(endpoint.slug)}:8000".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    if key_id is not None:
        scope[API_KEY_ID_SCOPE_KEY] = key_id
    sent: list[dict] = []

    received = []

    async def receive():
        if received:  # the client stays until the answer is over (the relay then stops waiting)
            await asyncio.sleep(3600)
        received.append(1)
        if chunked:  # the body in two messages
            received.append(1)
            return {"type": "http.request", "body": body[:5], "more_body": True}
        return {"type": "http.request", "body": body}

    if chunked:
        first = receive

        async def receive():
            if len(received) == 2:
                received.append(1)
                return {"type": "http.request", "body": body[5:]}
            return await first()

    async def send(message):
        sent.append(message)

    async def inner(scope, receive, send):
        raise AssertionError("an endpoint's request reached Django")

    async def main():
        local_tunnels.add(endpoint.node_id, tunnel)
        try:
            await TunnelProxyApp(inner)(scope, receive, send)
        finally:
            local_tunnels.discard(endpoint.node_id, tunnel)

    asyncio.run(main())
    return sent


def _minute_row(endpoint, key_id=None) -> UsageRollup:
    meter.flush()
    return UsageRollup.objects.get(granularity="minute", subject_id=endpoint.pk, api_key_id=key_id)


def test_a_json_answer_counts_its_reported_tokens_under_the_requests_api_key(endpoint, settings):
    settings.USAGE_FLUSH_S = 3600
    body = json.dumps({"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 22}}).encode()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
    sent = _request(endpoint, CannedTunnel([head, body[:20], body[20:]]), key_id=9)
    assert b"".join(m.get("body", b"") for m in sent) == body  # passed through unchanged
    row = _minute_row(endpoint, 9)
    assert (row.workspace_id, row.requests, row.errors) == (endpoint.cluster.workspace_id, 1, 0)
    assert (row.prompt_tokens, row.completion_tokens) == (11, 22)
    assert row.latency_ms_sum > 0


def _sse(*events: bytes) -> list[bytes]:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return [head] + [b"%x\r\n%s\r\n" % (len(e), e) for e in events]


def _event(payload) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def test_a_stream_counts_the_usage_of_its_final_chunk(endpoint, settings):
    settings.USAGE_FLUSH_S = 3600
    words = [_event({"choices": [{"delta": {"content": w}}], "usage": None}) for w in ("a", "b", "c")]
    final = _event({"choices": [], "usage": {"prompt_tokens": 6, "completion_tokens": 3}})
    _request(endpoint, CannedTunnel([*_sse(*words, final, b"data: [DONE]\n\n"), b"0\r\n\r\n"]))
    row = _minute_row(endpoint)
    assert (row.requests, row.errors, row.prompt_tokens, row.completion_tokens) == (1, 0, 6, 3)


def test_a_stream_cut_short_is_an_error_with_the_events_it_carried(endpoint, settings):
    settings.USAGE_FLUSH_S = 3600
    words = [_event({"choices": [{"delta": {"content": w}}]}) for w in ("a", "b")]
    _request(endpoint, CannedTunnel(_sse(*words), error="upstream closed"))  # no last chunk: cut
    row = _minute_row(endpoint)
    assert (row.requests, row.errors, row.prompt_tokens, row.completion_tokens) == (1, 1, 0, 2)


def test_metering_off_writes_nothing(endpoint, settings):
    settings.USAGE_METERING = False
    body = b'{"usage": {"prompt_tokens": 1, "completion_tokens": 1}}'
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
    sent = _request(endpoint, CannedTunnel([head, body]))
    assert sent[0]["status"] == 200
    assert meter.flush() == 0
    assert not UsageRollup.objects.exists()


def _upstream_body(tunnel: CannedTunnel) -> dict:
    return json.loads(tunnel.request.split(b"\r\n\r\n", 1)[1])


@pytest.mark.parametrize("chunked", [False, True])
def test_a_stream_that_did_not_ask_for_usage_is_charged_the_servers_count_and_the_client_sees_no_usage_chunk(
    endpoint, settings, chunked
):
    """The proxy asks the server for the usage chunk (prompt tokens included) and drops it on the way back:
    the client gets the stream it asked for; the meter the server's real count, not one per event."""
    settings.USAGE_FLUSH_S = 3600
    words = [_event({"choices": [{"delta": {"content": w}}], "usage": None}) for w in ("ab", "cd", "ef")]
    final = _event({"choices": [], "usage": {"prompt_tokens": 17, "completion_tokens": 9}})
    done = b"data: [DONE]\n\n"
    # the usage chunk cut across two reads, with [DONE] in the second
    tunnel = CannedTunnel([*_sse(*words, final[:25], final[25:] + done), b"0\r\n\r\n"])
    asked = json.dumps({"model": "m", "stream": True, "stream_options": {"foo": 1}, "messages": []}).encode()
    sent = _request(endpoint, tunnel, body=asked, chunked=chunked)
    upstream = _upstream_body(tunnel)
    assert upstream["stream_options"] == {"foo": 1, "include_usage": True}
    assert upstream["messages"] == []
    head = tunnel.request.split(b"\r\n\r\n", 1)[0].lower()
    assert b"content-length: %d" % len(json.dumps(upstream, separators=(",", ":"))) in head
    relayed = b"".join(m.get("body", b"") for m in sent)
    assert relayed == b"".join(words) + done  # the client's stream, without the added usage chunk
    assert all(b"content-length" != k.lower() for k, _ in sent[0]["headers"])
    row = _minute_row(endpoint)
    assert (row.requests, row.errors, row.prompt_tokens, row.completion_tokens) == (1, 0, 17, 9)


def test_a_stream_that_asked_for_usage_keeps_its_usage_chunk_and_other_requests_go_as_sent(endpoint, settings):
    settings.USAGE_FLUSH_S = 3600
    words = [_event({"choices": [{"delta": {"content": w}}], "usage": None}) for w in ("a", "b")]
    final = _event({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}})
    done = b"data: [DONE]\n\n"
    body = json.dumps({"stream": True, "stream_options": {"include_usage": True}}).encode()
    tunnel = CannedTunnel([*_sse(*words, final, done), b"0\r\n\r\n"])
    sent = _request(endpoint, tunnel, body=body)
    assert tunnel.request.endswith(body)  # unchanged
    assert b"".join(m.get("body", b"") for m in sent) == b"".join(words) + final + done
    answer = json.dumps({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(answer)
    tunnel = CannedTunnel([head, answer])
    _request(endpoint, tunnel, body=b'{"stream": false}')
    assert tunnel.request.endswith(b'{"stream": false}')


def test_a_json_answer_over_four_mib_is_still_charged(endpoint, settings):
    settings.USAGE_FLUSH_S = 3600
    text = "x" * (meter.JSON_BODY_MAX + 100_000)
    body = json.dumps(
        {"choices": [{"message": {"content": text}}], "usage": {"prompt_tokens": 5, "completion_tokens": 70_000}}
    ).encode()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
    cut = len(body) - 30  # the usage object cut across two reads
    chunks = [body[i : min(i + 65536, cut)] for i in range(0, cut, 65536)] + [body[cut:]]
    sent = _request(endpoint, CannedTunnel([head, *chunks]))
    assert b"".join(m.get("body", b"") for m in sent) == body
    row = _minute_row(endpoint)
    assert (row.prompt_tokens, row.completion_tokens) == (5, 70_000)

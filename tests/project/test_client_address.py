"""The client's address (kernel.client_address): the socket's peer, unless a TRUSTED_PROXIES proxy forwarded
it; a forged or malformed X-Forwarded-For never makes a new client, and never a 500."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from asgiref.testing import ApplicationCommunicator
from django.conf import settings as django_settings
from django.core.cache import cache
from django.core.handlers.asgi import ASGIHandler
from rest_framework.test import APIClient

from cleverthis.asgi import routes
from fleet.workloads import services as workload_services
from kernel.client_address import (
    ForwardedClientMiddleware,
    TrustedProxies,
    check_trusted_proxies,
    forwarded_client,
    parse_ip,
    valid_ip,
)
from tenancy import api_keys
from tenancy.models import ApiKey

REGISTER = "/api/v1/agent/register"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("203.0.113.9", "203.0.113.9"),
        (" 203.0.113.9:4711 ", "203.0.113.9"),
        ("2001:db8::1", "2001:db8::1"),
        ("[2001:db8::1]:443", "2001:db8::1"),
        ("::ffff:192.0.2.1", "192.0.2.1"),
        ("not-an-ip", None),
        ("", None),
        ("unknown", None),
        ("1.2.3.4.5", None),
        ("<script>", None),
        ("9" * 200, None),
    ],
)
def test_only_ip_addresses_are_addresses(value, expected):
    assert valid_ip(value) == expected


def test_trusted_proxies_refuse_everyone_and_junk_at_start():
    assert check_trusted_proxies(["10.0.0.0/8", "192.0.2.1", "proxy", "ingress.example.com", "::1"]) == []
    assert any("every client" in e for e in check_trusted_proxies(["*"]))
    assert any("every client" in e for e in check_trusted_proxies(["0.0.0.0/0"]))
    assert check_trusted_proxies(["10.0.0.0/33"]) == ["'10.0.0.0/33' is not a network"]
    assert len(check_trusted_proxies(["not a host!"])) == 1


def test_the_forwarded_client_is_the_rightmost_address_that_is_not_a_trusted_proxy():
    proxies = TrustedProxies(["10.0.0.0/8"])
    # a client that forged the header, behind a proxy that appends: the forged entry is never taken
    assert forwarded_client([(b"x-forwarded-for", b"6.6.6.6, 198.51.100.7")], proxies) == parse_ip("198.51.100.7")
    assert forwarded_client([(b"x-forwarded-for", b"198.51.100.7, 10.1.1.1")], proxies) == parse_ip("198.51.100.7")
    # several header lines are one list
    headers = [(b"x-forwarded-for", b"6.6.6.6"), (b"x-forwarded-for", b"198.51.100.8")]
    assert forwarded_client(headers, proxies) == parse_ip("198.51.100.8")
    # a malformed entry on the way: the header says nothing
    assert forwarded_client([(b"x-forwarded-for", b"198.51.100.7, bogus")], proxies) is None
    assert forwarded_client([(b"x-forwarded-for", b"")], proxies) is None
    assert forwarded_client([(b"x-forwarded-for", b",".join([b"198.51.100.1"] * 40))], proxies) is None
    assert forwarded_client([], proxies) is None


async def _scope_seen(middleware_proxies: list[str], client: tuple[str, int] | None, headers, kind="http"):
    seen: dict[str, Any] = {}

    async def app(scope, receive, send):
        seen.update(scope)

    scope = {"type": kind, "scheme": "http" if kind == "http" else "ws", "path": "/", "headers": headers}
    if client is not None:
        scope["client"] = client
    await ForwardedClientMiddleware(app, TrustedProxies(middleware_proxies))(scope, None, None)
    return seen


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("trusted", "peer", "header", "client", "scheme"),
    [
        # a trusted proxy: its client and scheme
        (["127.0.0.1"], "127.0.0.1", b"203.0.113.9", "203.0.113.9", "https"),
        (["127.0.0.0/8"], "127.0.0.2", b"203.0.113.9", "203.0.113.9", "https"),
        # anyone else's headers are ignored, the default trusts no one
        (["127.0.0.1"], "192.0.2.50", b"203.0.113.9", "192.0.2.50", "http"),
        ([], "127.0.0.1", b"203.0.113.9", "127.0.0.1", "http"),
        # a malformed address from the trusted proxy: the peer stays the client (never a 500 later)
        (["127.0.0.1"], "127.0.0.1", b"not-an-ip", "127.0.0.1", "https"),
        (["127.0.0.1"], "127.0.0.1", b"203.0.113.9\r\nX: y", "127.0.0.1", "https"),
    ],
)
async def test_the_middleware_believes_trusted_proxies_only(trusted, peer, header, client, scheme):
    headers = [(b"x-forwarded-for", header), (b"x-forwarded-proto", b"https")]
    seen = await _scope_seen(trusted, (peer, 5000), headers)
    assert seen["client"][0] == client
    assert seen["scheme"] == scheme


@pytest.mark.asyncio
async def test_a_websocket_behind_tls_is_wss_and_a_strange_scheme_is_ignored():
    seen = await _scope_seen(["127.0.0.1"], ("127.0.0.1", 1), [(b"x-forwarded-proto", b"https")], kind="websocket")
    assert seen["scheme"] == "wss"
    seen = await _scope_seen(["127.0.0.1"], ("127.0.0.1", 1), [(b"x-forwarded-proto", b"javascript")])
    assert seen["scheme"] == "http"


@pytest.mark.asyncio
async def test_a_proxy_named_by_host_name_is_trusted_at_the_addresses_it_resolves_to():
    seen = await _scope_seen(["localhost"], ("127.0.0.1", 1), [(b"x-forwarded-for", b"203.0.113.9")])
    assert seen["client"][0] == "203.0.113.9"
    seen = await _scope_seen(["localhost"], ("192.0.2.50", 1), [(b"x-forwarded-for", b"203.0.113.9")])
    assert seen["client"][0] == "192.0.2.50"


@pytest.mark.asyncio
async def test_a_name_that_resolves_nowhere_trusts_no_one():
    seen = await _scope_seen(["no-such-proxy.invalid"], ("127.0.0.1", 1), [(b"x-forwarded-for", b"203.0.113.9")])
    assert seen["client"][0] == "127.0.0.1"


# ---- through the application: the limits and the API keys' last use


@pytest.fixture
def no_counters_left():
    client = redis.Redis.from_url(django_settings.CACHES["default"]["LOCATION"])
    pattern = cache.make_key("throttle:*")

    def clear() -> None:
        for key in client.scan_iter(match=pattern):
            client.delete(key)

    clear()
    yield
    clear()
    client.close()


async def _post(app, path: str, peer: str, forwarded: bytes | None) -> int:
    headers = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json")]
    if forwarded is not None:
        headers.append((b"x-forwarded-for", forwarded))
    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": headers,
        "client": (peer, 40000),
        "server": ("127.0.0.1", 8000),
    }
    communicator = ApplicationCommunicator(app, scope)
    await communicator.send_input({"type": "http.request", "body": json.dumps({}).encode()})
    start = await communicator.receive_output(10)
    while (await communicator.receive_output(10)).get("more_body"):
        pass
    return start["status"]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_agent_registration_is_limited_per_real_client_behind_the_proxy(settings, no_counters_left):
    settings.AGENT_REGISTER_RATE = "2/day"
    app = ForwardedClientMiddleware(routes, TrustedProxies(["127.0.0.1"]))
    # through the proxy (127.0.0.1): each real client has its own limit
    assert [await _post(app, REGISTER, "127.0.0.1", b"198.51.100.1") for _ in range(3)] == [400, 400, 429]
    assert await _post(app, REGISTER, "127.0.0.1", b"198.51.100.2") == 400
    # a client reaching web directly cannot make itself new clients with a forged header
    statuses = [await _post(app, REGISTER, "192.0.2.50", f"203.0.113.{n}".encode()) for n in range(3)]
    assert statuses == [400, 400, 429]
    # a malformed forwarded address is the proxy's own (counted, never a 500)
    assert [await _post(app, REGISTER, "127.0.0.1", b"not-an-ip") for _ in range(3)] == [400, 400, 429]


@pytest.mark.django_db
def test_a_keys_last_use_never_records_a_malformed_address(workspace, owner):
    raw = workload_services.api_key_create(actor=owner, workspace=workspace, name="k", scopes=["read"])[1]
    key = ApiKey.objects.get()
    api_keys._last_written.pop(key.pk, None)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get("/api/v1/clusters/", REMOTE_ADDR="not-an-ip").status_code == 200
    key.refresh_from_db()
    assert key.last_used_at is not None
    assert key.last_used_ip is None


async def _get_headers(app, path: str, peer: str, headers: list[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1:8000"), *headers],
        "client": (peer, 40000),
        "server": ("127.0.0.1", 8000),
    }
    communicator = ApplicationCommunicator(app, scope)
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(10)
    while (await communicator.receive_output(10)).get("more_body"):
        pass
    assert start["status"] == 200
    return {name.lower(): value for name, value in start["headers"]}


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_answers_over_https_through_the_trusted_proxy_carry_hsts(settings):
    settings.SECURE_HSTS_SECONDS = 31536000
    # Django's middleware reads its settings when the handler is made (at process start in production)
    app = ForwardedClientMiddleware(ASGIHandler(), TrustedProxies(["127.0.0.1"]))
    tls = [(b"x-forwarded-proto", b"https")]
    through_proxy = await _get_headers(app, "/healthz", "127.0.0.1", tls)
    assert through_proxy[b"strict-transport-security"] == b"max-age=31536000"
    # plain http, or a client claiming https itself: no HSTS (browsers ignore it over http anyway)
    assert b"strict-transport-security" not in await _get_headers(app, "/healthz", "127.0.0.1", [])
    assert b"strict-transport-security" not in await _get_headers(app, "/healthz", "192.0.2.50", tls)

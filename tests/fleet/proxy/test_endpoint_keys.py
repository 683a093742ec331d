"""API keys on endpoint origins: the invoke scope, the key's workspace and endpoints, its rate limits."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis
from django.conf import settings as django_settings
from django.utils import timezone

from fleet import origin_names
from fleet.proxy import endpoint_routes, rate_limits
from fleet.proxy.resolvers import ProxyRefusal, ProxyTarget
from fleet.usage import meter as usage_meter
from fleet.usage.models import UsageRollup
from fleet.workloads import services as workload_services
from fleet.workloads.models import Endpoint, EndpointStatus
from kernel.asgi_scope import API_KEY_ID_SCOPE_KEY
from kernel.metrics import API_KEY_RATE_LIMITED
from tenancy import api_keys
from tenancy.models import ApiKey
from tests.support.endpoints import endpoint_row
from tests.support.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)  # the resolver reads the database from a thread


@pytest.fixture(autouse=True)
def _clean():
    endpoint_routes.forget_routes()
    api_keys.forget_grants()
    yield
    endpoint_routes.forget_routes()
    api_keys.forget_grants()
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    for key in client.scan_iter(match=f"{rate_limits.PREFIX}*"):
        client.delete(key)


@pytest.fixture
def fresh_window():
    """Start early in a minute's window, so a test's requests all fall in one."""
    wait_until(lambda: time.time() % 60 < 45, timeout=20, what="a minute's window with time to spare")


@pytest.fixture
def endpoint(cluster, node) -> Endpoint:
    return endpoint_row(cluster=cluster, node=node, model_id="org/m", status=EndpointStatus.RUNNING, port=81)


def key(owner, workspace, scopes=("invoke",), **extra) -> str:
    return workload_services.api_key_create(actor=owner, workspace=workspace, name="k", scopes=scopes, **extra)[1]


def scope(endpoint: Endpoint, raw: str = "", scheme: str = "Bearer") -> dict:
    headers = [(b"host", origin_names.ENDPOINT.host(endpoint.slug).encode())]
    if raw:
        headers.append((b"authorization", f"{scheme} {raw}".encode()))
    return {"type": "http", "method": "POST", "path": "/v1/chat/completions", "query_string": b"", "headers": headers}


def resolve(request_scope: dict):
    return asyncio.run(endpoint_routes.resolve_endpoint(request_scope))


def test_an_invoke_key_reaches_its_endpoint_and_names_itself_for_metering(endpoint, owner, workspace):
    raw = key(owner, workspace)
    request = scope(endpoint, raw)
    assert isinstance(resolve(request), ProxyTarget)
    assert request[API_KEY_ID_SCOPE_KEY] == ApiKey.objects.get().pk
    assert ApiKey.objects.get().last_used_at is not None


def test_keys_without_the_right_are_refused(endpoint, owner, workspace, other_workspace, cluster, node):
    assert resolve(scope(endpoint, key(owner, workspace, ("read", "operate")))) == ProxyRefusal(
        403, endpoint_routes.NO_INVOKE
    )
    theirs = other_workspace.memberships.get().user
    assert resolve(scope(endpoint, key(theirs, other_workspace))).status == 404
    other = endpoint_row(cluster=cluster, node=node, model_id="org/n", status=EndpointStatus.RUNNING, port=82)
    assert resolve(scope(endpoint, key(owner, workspace, endpoints=[other]))) == ProxyRefusal(
        403, endpoint_routes.NOT_THIS_ENDPOINT
    )
    assert isinstance(resolve(scope(other, key(owner, workspace, endpoints=[other]))), ProxyTarget)
    assert resolve(scope(endpoint, "ctk_00000000_nosuchkey")) == ProxyRefusal(401, endpoint_routes.BAD_KEY)


def test_a_revoked_or_expired_key_is_refused(endpoint, owner, workspace, settings):
    settings.API_KEY_CACHE_S = 0
    raw = key(owner, workspace)
    assert isinstance(resolve(scope(endpoint, raw, "Token")), ProxyTarget)
    ApiKey.objects.update(expires_at=timezone.now())
    assert resolve(scope(endpoint, raw)).status == 401
    ApiKey.objects.update(expires_at=None, revoked_at=timezone.now())
    assert resolve(scope(endpoint, raw)).status == 401


def test_a_cached_key_on_a_cached_route_needs_no_thread_hop(endpoint, owner, workspace, monkeypatch):
    raw = key(owner, workspace)
    resolve(scope(endpoint, raw))  # warm both caches

    def no_database(*args, **kwargs):
        raise AssertionError("the database was consulted")

    monkeypatch.setattr(endpoint_routes, "_decide", no_database)
    assert isinstance(resolve(scope(endpoint, raw)), ProxyTarget)


def test_requests_over_the_key_limit_get_429_with_retry_after(fresh_window, endpoint, owner, workspace):
    raw = key(owner, workspace, requests_per_min=2)
    before = API_KEY_RATE_LIMITED.labels("requests")._value.get()
    assert all(isinstance(resolve(scope(endpoint, raw)), ProxyTarget) for _ in range(2))
    refused = resolve(scope(endpoint, raw))
    assert refused.status == 429
    retry_after = int(dict(refused.headers)[b"retry-after"])
    assert 1 <= retry_after <= 60
    assert json.loads(refused.message)["error"]["limit"] == "requests_per_minute"
    assert API_KEY_RATE_LIMITED.labels("requests")._value.get() == before + 1
    assert isinstance(resolve(scope(endpoint, key(owner, workspace))), ProxyTarget)  # other keys unaffected
    # the refusal is in the key's usage (apart from the requests served)
    usage_meter.flush()
    row = UsageRollup.objects.get(granularity="minute", subject_id=endpoint.pk, api_key_id=ApiKey.objects.last().pk)
    assert (row.rate_limited, row.requests) == (1, 0)


def test_the_endpoint_default_limits_each_key(fresh_window, endpoint, owner, workspace):
    Endpoint.objects.filter(pk=endpoint.pk).update(key_requests_per_min=1)
    first, second = key(owner, workspace), key(owner, workspace)
    assert isinstance(resolve(scope(endpoint, first)), ProxyTarget)
    assert resolve(scope(endpoint, first)).status == 429
    assert isinstance(resolve(scope(endpoint, second)), ProxyTarget)


def test_tokens_charged_after_responses_exhaust_the_budget(fresh_window, endpoint, owner, workspace):
    raw = key(owner, workspace, tokens_per_min=100)
    key_id = ApiKey.objects.get().pk
    assert isinstance(resolve(scope(endpoint, raw)), ProxyTarget)
    rate_limits.charge_tokens(key_id, endpoint.pk, 99)
    assert isinstance(resolve(scope(endpoint, raw)), ProxyTarget)
    rate_limits.charge_tokens(key_id, endpoint.pk, 1)
    refused = resolve(scope(endpoint, raw))
    assert refused.status == 429
    assert json.loads(refused.message)["error"]["limit"] == "tokens_per_minute"


def test_the_tokens_an_answer_reports_count_against_its_keys_tokens_per_minute(
    fresh_window, endpoint, owner, workspace, settings
):
    settings.USAGE_FLUSH_S = 3600
    raw = key(owner, workspace, tokens_per_min=100)
    request = scope(endpoint, raw)
    assert isinstance(resolve(request), ProxyTarget)
    key_id = request[API_KEY_ID_SCOPE_KEY]

    async def answered(prompt: int, completion: int) -> None:
        usage = usage_meter.start(usage_meter.Subject(workspace.pk, endpoint.pk), {API_KEY_ID_SCOPE_KEY: key_id})
        usage.head(200, [(b"content-type", b"application/json")])
        body = {"usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
        usage.feed(json.dumps(body).encode())
        usage.finish(complete=True)
        await asyncio.gather(*rate_limits._charging)  # the charge is on its way to Redis

    asyncio.run(answered(60, 39))
    assert isinstance(resolve(scope(endpoint, raw)), ProxyTarget)  # 99 of 100
    asyncio.run(answered(1, 0))
    refused = resolve(scope(endpoint, raw))
    assert refused.status == 429
    assert json.loads(refused.message)["error"]["limit"] == "tokens_per_minute"


def test_answers_of_keys_without_a_tokens_limit_are_not_charged(fresh_window, endpoint, owner, workspace, settings):
    settings.USAGE_FLUSH_S = 3600
    raw = key(owner, workspace, requests_per_min=100)  # a limit, but none on tokens
    request = scope(endpoint, raw)
    assert isinstance(resolve(request), ProxyTarget)
    key_id = request[API_KEY_ID_SCOPE_KEY]

    async def answered() -> None:
        usage = usage_meter.start(usage_meter.Subject(workspace.pk, endpoint.pk), {API_KEY_ID_SCOPE_KEY: key_id})
        usage.head(200, [(b"content-type", b"application/json")])
        usage.feed(json.dumps({"usage": {"prompt_tokens": 5, "completion_tokens": 7}}).encode())
        usage.finish(complete=True)
        assert not rate_limits._charging  # nothing sent to Redis
        await asyncio.sleep(0)

    asyncio.run(answered())
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    assert not list(client.scan_iter(match=f"{rate_limits.PREFIX}:tok:*"))


def test_windows_end(endpoint, owner, workspace):
    limits = rate_limits.Limits(key_requests=1)
    assert asyncio.run(rate_limits.admit(7, endpoint.pk, limits, now=120.0)) is None
    refusal = asyncio.run(rate_limits.admit(7, endpoint.pk, limits, now=150.0))
    assert refusal == rate_limits.Refusal("requests", 30)
    assert asyncio.run(rate_limits.admit(7, endpoint.pk, limits, now=180.0)) is None


def test_a_key_limited_to_a_deleted_endpoint_stays_limited(endpoint, owner, workspace, cluster, node):
    other = endpoint_row(cluster=cluster, node=node, model_id="org/n", status=EndpointStatus.RUNNING, port=82)
    raw = key(owner, workspace, endpoints=[other])
    other.delete()
    assert resolve(scope(endpoint, raw)) == ProxyRefusal(403, endpoint_routes.NOT_THIS_ENDPOINT)


def test_other_node_origins_take_invoke_keys_within_their_workspace(endpoint, owner, workspace, other_workspace):
    """Serve deployments ask `origins.caller_on_origin`: an invoke key not limited to chosen endpoints."""
    from fleet.proxy import origins
    from tenancy import services as tenancy
    from tenancy.permissions import can_operate, can_view

    tenancy.membership_set(workspace=other_workspace, user=owner, role="viewer")
    user = origins.caller_on_origin(scope(endpoint, key(owner, workspace)))
    assert user == owner
    assert can_view(user, workspace)
    assert not can_view(user, other_workspace)  # the key's workspace only
    assert not can_operate(user, workspace)  # no operate scope
    assert not origins.caller_on_origin(scope(endpoint, key(owner, workspace, ("read",)))).is_authenticated
    limited = key(owner, workspace, endpoints=[endpoint])
    assert not origins.caller_on_origin(scope(endpoint, limited)).is_authenticated


def test_the_endpoint_default_limits_members_by_origin_cookie_and_older_tokens_too(
    fresh_window, endpoint, owner, workspace, member_of
):
    """The per-key limits are not evaded by calling without a key: a member with the origin cookie and a
    member with an older DRF token are each limited like a key (per user), requests and tokens."""
    from http.cookies import SimpleCookie

    from rest_framework.authtoken.models import Token

    from fleet.proxy import origins

    Endpoint.objects.filter(pk=endpoint.pk).update(key_requests_per_min=1)
    endpoint_routes.forget_routes()
    host = origin_names.ENDPOINT.host(endpoint.slug)
    cookie = SimpleCookie(origins.origin_cookie_header(user_id=str(owner.pk), host=host, secure=False).decode())
    by_cookie = scope(endpoint)
    by_cookie["headers"].append((b"cookie", f"{origins.ORIGIN_COOKIE}={cookie[origins.ORIGIN_COOKIE].value}".encode()))
    assert isinstance(resolve(dict(by_cookie, headers=list(by_cookie["headers"]))), ProxyTarget)
    refused = resolve(dict(by_cookie, headers=list(by_cookie["headers"])))
    assert refused.status == 429
    assert json.loads(refused.message)["error"]["limit"] == "requests_per_minute"

    viewer = member_of(workspace, "viewer")
    token = Token.objects.create(user=viewer).key
    assert isinstance(resolve(scope(endpoint, token, "Token")), ProxyTarget)  # another caller: its own count
    assert resolve(scope(endpoint, token, "Token")).status == 429

    # tokens: a member's answers are charged to that member on this endpoint
    Endpoint.objects.filter(pk=endpoint.pk).update(key_requests_per_min=None, key_tokens_per_min=10)
    endpoint_routes.forget_routes()
    other = member_of(workspace, "member")
    other_token = Token.objects.create(user=other).key
    request = scope(endpoint, other_token, "Token")
    assert isinstance(resolve(request), ProxyTarget)

    async def answered() -> None:
        usage = usage_meter.start(usage_meter.Subject(workspace.pk, endpoint.pk), request)
        usage.head(200, [(b"content-type", b"application/json")])
        usage.feed(json.dumps({"usage": {"prompt_tokens": 4, "completion_tokens": 6}}).encode())
        usage.finish(complete=True)
        await asyncio.gather(*rate_limits._charging)

    asyncio.run(answered())
    refused = resolve(scope(endpoint, other_token, "Token"))
    assert refused.status == 429
    assert json.loads(refused.message)["error"]["limit"] == "tokens_per_minute"


def test_a_redis_outage_lets_requests_through_and_is_counted(endpoint, owner, workspace, settings):
    """The limiter fails open (stated in the README) and says so in /metrics."""
    from kernel.metrics import RATE_LIMIT_UNAVAILABLE

    limits = rate_limits.Limits(key_requests=1)
    before = RATE_LIMIT_UNAVAILABLE.labels("admit")._value.get()
    charged = RATE_LIMIT_UNAVAILABLE.labels("charge")._value.get()
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    rate_limits._async_clients.clear()
    rate_limits._sync_client = None
    try:
        assert asyncio.run(rate_limits.admit(8, endpoint.pk, limits)) is None
        assert asyncio.run(rate_limits.admit(8, endpoint.pk, limits)) is None
        rate_limits.charge_tokens(8, endpoint.pk, 5)
    finally:
        rate_limits._async_clients.clear()
        rate_limits._sync_client = None
    assert RATE_LIMIT_UNAVAILABLE.labels("admit")._value.get() == before + 2
    assert RATE_LIMIT_UNAVAILABLE.labels("charge")._value.get() == charged + 1

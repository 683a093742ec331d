"""Route endpoint URLs to their node through the tunnel proxy.

An endpoint is served only on its own origin `endpoint-<slug>.<ENDPOINT_DOMAIN>` (behind a wildcard DNS
record and certificate; `*.localhost` locally). The older path form `/endpoints/<slug>/…` on the control
plane's host redirects there (`resolvers.redirect_to_origin`) and is never proxied. Endpoints need an API
key or token, or the origin cookie a signed-in member gets through a ticket (`fleet.proxy.origins`), unless
they are marked public; the control plane's session cookie is never accepted on an endpoint's origin.
Every member of the endpoint's workspace, Viewers included, may call it with any method (a `POST` to
`/v1/chat/completions` is its normal use), as the API lets any member's token call it; starting, stopping
or changing an endpoint is done on the control plane (Owners and Admins). A browser's state-changing call
made with the origin cookie must come from this very origin (`fleet.proxy.origin_guard`).

An endpoint's requests are balanced over its running replicas on nodes that are not offline (a replica
whose replacement runs already, or that was retired by a scale-down, is left out: it finishes what it
serves and stops) by the endpoint's routing policy: `least_load` (the fewest requests in flight over all
web processes), `session` or `prefix` (affinity by a session key or the leading prompt text, with bounded
load: `fleet.balancer`, `fleet.proxy.affinity`), and a connect failure is tried once on another replica
(`relay.proxy_http`). A request whose `model` names one of the endpoint's LoRA adapters goes to a replica
that has it loaded (any replica while none has yet: vLLM answers 404 for an adapter it does not hold), and
its usage counts for the adapter too.

Where an endpoint leads (its replicas' nodes and ports, its status and whether it is public) is kept in
process memory for `PROXY_ROUTE_CACHE_S` (default 2 s), so a stream of requests to one endpoint costs no database query
each: saving or deleting an endpoint, a replica or a node in this process forgets the cached routes at once, and
changes made elsewhere (another replica, a worker) are seen within that time. Credentials are still
checked on every request. What the proxy reads from the database it reads on the thread pool, never on the
one thread the pages, the API and `/healthz` share: with hundreds of streams opening while a fleet of tunnels
reconnects (a roll), the route reloads queued there made `/healthz` miss the load balancer's 2 s check and
took healthy replicas out. The routes, keys and budget stops requests use are re-read in the background
before they go stale (`fleet.proxy.warm_caches`), so a caller sending one request
every few seconds waits for no query either.

An API key (`Authorization: Bearer ctk_…`) must hold the invoke scope, belong to the endpoint's workspace
and, if it is limited to chosen endpoints, name this one (`fleet.proxy.key_access`); its requests are
admitted by its rate limits first (`fleet.proxy.rate_limits`: 429 with Retry-After; a member calling with
the origin cookie or an older DRF token is held to the endpoint's per-key limits the same way, counted per
user), then by the budgets' hard stops of its workspace and key (`fleet.usage.budget_stops`: 429 with a JSON
reason naming the budget, from a per-process copy: no round trip per request), and its id goes in the
request's scope (`kernel.asgi_scope.API_KEY_ID_SCOPE_KEY`) for metering.
With the route and the key cached, a key's request is answered without a thread hop, as a public one is.

An endpoint that scales to zero (`min_replicas` 0) and sleeps (idle: "Scaled to zero") is woken by a
request that is let in (authorised, and admitted by its key's rate limits first): the first such request in
a process starts one poller for the endpoint, which wakes it (`endpoint_wake`: idempotent across processes,
one replica start) and re-reads its route every ENDPOINT_COLD_START_POLL_S; every request waiting for that
endpoint in this process awaits that one poller (no thread or database connection per waiting request), and
is proxied once a replica runs. A request to such an endpoint whose replica is still on its way (pending,
starting) waits the same way. After ENDPOINT_COLD_START_S without a running replica it gets a 503 JSON
error with Retry-After; a start the workspace's quotas refuse answers 409, one that fits on no node 503.

Each forwarded request counts towards the endpoint's `request_count` and `last_request_at`: counted in
this process and written aside (the request does not wait for it) with one UPDATE at most every
`ENDPOINT_REQUESTS_FLUSH_S` (default 5 s) per endpoint: the first request of a quiet endpoint at once,
the ones of a burst with the first request after that interval (so the figures of a burst's tail wait for
the endpoint's next request). Each also
counts, with its status and time to first byte, in its workspace's per-minute rollups for the home page
(`fleet.proxy.request_meter`), and its tokens and latency in the usage rollups (`fleet.usage.meter`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from channels.db import DatabaseSyncToAsync
from django.conf import settings
from django.db.models import F
from django.db.models.signals import post_delete, post_save
from django.utils import timezone

from fleet import admission, origin_names, replica_load
from fleet.balancer import LEAST_LOAD, Upstream
from fleet.models import Node, NodeStatus
from fleet.proxy import key_access, origins, rate_limits, warm_caches
from fleet.proxy.resolvers import Answer, ProxyRefusal, ProxyTarget, redirect_to_origin, register_resolver
from fleet.usage import budget_stops
from fleet.usage import meter as usage_meter
from fleet.workloads.models import Endpoint, EndpointAdapter, EndpointReplica, EndpointStatus
from fleet.workloads.services import PlacementError, endpoint_wake
from fleet.workloads.services.endpoints.adapters import ENABLE_LORA
from kernel import timeseries
from kernel.asgi_scope import RATE_CALLER_SCOPE_KEY
from kernel.exceptions import QuotaExceeded
from tenancy import api_keys
from tenancy.api_keys import MISSING, KeyGrant
from tenancy.models import Workspace
from tenancy.permissions import can_view

log = logging.getLogger(__name__)

PATH_FORM = re.compile(r"^/endpoints/(?P<slug>[0-9a-f]{12})(?P<rest>/.*)?$")
UNAUTHENTICATED = (
    "This endpoint needs an API key (Authorization: Bearer <key>; Settings → API keys), "
    "or open it from the control plane while signed in."
)
BAD_KEY = "Invalid, expired or revoked API key."
NO_INVOKE = "This API key lacks the invoke scope."
NOT_THIS_ENDPOINT = "This API key is limited to other endpoints."
_KEY_USE = "cleverthis.api_key_use"  # scope key: (caller, endpoint id, Limits) of a rate-limited request


# Tokens the usage meter reads from each answer count against the key's tokens per minute.
usage_meter.on_request_metered(rate_limits.charge_metered)


def _slug_and_path(scope: dict[str, Any]) -> tuple[str, str] | None:
    """(slug, path) of a request made to an endpoint's own origin, else None."""
    slug = origin_names.ENDPOINT.ident(origins.request_host(scope))
    return (slug, scope["path"]) if slug else None


@dataclass(frozen=True)
class _Route:
    """What a request to one endpoint needs to know, read from the database at `loaded_at`."""

    public: bool
    endpoint_id: UUID
    key_requests_per_min: int | None
    key_tokens_per_min: int | None
    workspace: Workspace
    status: str
    scales_to_zero: bool  # min_replicas 0: a request to it asleep (idle) or on its way waits for a replica
    replicas: tuple[Upstream, ...]  # the running ones on nodes that are not offline
    offline: tuple[Upstream, ...]  # the running ones whose node is offline
    loaded_at: float
    routing: str = LEAST_LOAD  # the endpoint's routing policy
    queue: admission.QueuePolicy | None = None  # its concurrency limit per replica and its wait queue
    # its attached LoRA adapters: name → (adapter id, server ids of the running replicas that have it loaded)
    adapters: Mapping[str, tuple[UUID, frozenset[str]]] = field(default_factory=dict)


_ROUTE_CACHE_MAX = 10_000
_routes: dict[str, _Route] = {}  # slug → route of an existing endpoint (unknown slugs are not kept)


def forget_routes(**_: Any) -> None:
    """Drop every cached route (an endpoint or a node changed in this process)."""
    _routes.clear()


for _model in (Endpoint, EndpointReplica, EndpointAdapter, Node):
    post_save.connect(forget_routes, sender=_model, dispatch_uid=f"endpoint-routes-{_model.__name__}-save")
    post_delete.connect(forget_routes, sender=_model, dispatch_uid=f"endpoint-routes-{_model.__name__}-delete")


def _cached_route(slug: str) -> _Route | None:
    """The cached route of `slug` if it is younger than PROXY_ROUTE_CACHE_S."""
    route = _routes.get(slug)
    if route is None or time.monotonic() - route.loaded_at >= settings.PROXY_ROUTE_CACHE_S:
        return None
    return route


def _load_route(slug: str) -> _Route | None:
    started = time.monotonic()  # (its age counts from before the read)
    endpoint = Endpoint.objects.select_related("cluster__workspace").filter(slug=slug).first()
    route = None
    if endpoint is not None:
        running = list(
            EndpointReplica.objects.filter(endpoint=endpoint, status=EndpointStatus.RUNNING, node__isnull=False)
            .exclude(port=0)
            .exclude(replacements__status=EndpointStatus.RUNNING)  # handed over: draining its last requests
            .filter(retired_at__isnull=True)  # scaled down or to zero: draining its last requests
            .exclude(group_rank__gt=0)  # a distributed endpoint's followers serve no HTTP: its leader answers
            .order_by("created_at", "server_id")
            .values_list("server_id", "node_id", "port", "node__status", "adapters")
        )
        upstreams = [(Upstream(key, node_id, port), node_status) for key, node_id, port, node_status, _ in running]
        adapters = {}
        if ENABLE_LORA in endpoint.server_args:  # (adapters attach only there: other routes cost no query)
            attached = EndpointAdapter.objects.filter(endpoint=endpoint).values_list("adapter__name", "adapter_id")
            adapters = {
                name: (adapter_id, frozenset(key for key, *_, held in running if name in (held or ())))
                for name, adapter_id in attached
            }
        route = _Route(
            public=endpoint.public,
            endpoint_id=endpoint.pk,
            key_requests_per_min=endpoint.key_requests_per_min,
            key_tokens_per_min=endpoint.key_tokens_per_min,
            workspace=endpoint.cluster.workspace,
            status=endpoint.status,
            scales_to_zero=endpoint.min_replicas == 0,
            replicas=tuple(u for u, node_status in upstreams if node_status != NodeStatus.OFFLINE),
            offline=tuple(u for u, node_status in upstreams if node_status == NodeStatus.OFFLINE),
            loaded_at=started,
            routing=endpoint.routing_policy,
            queue=admission.QueuePolicy(
                str(endpoint.pk),
                endpoint.concurrency_limit,
                endpoint.queue_depth,
                endpoint.queue_wait_s,
                endpoint.cold_start_wait_s,
            ),
            adapters=adapters,
        )
    if route is not None and settings.PROXY_ROUTE_CACHE_S > 0:
        if len(_routes) >= _ROUTE_CACHE_MAX:
            _routes.clear()
        _routes[slug] = route
    return route


def _route_age(slug: str) -> float | None:
    route = _routes.get(slug)
    return None if route is None else time.monotonic() - route.loaded_at


def _reload_routes(slugs: list[str]) -> None:
    """Re-read the cached routes of `slugs` (sync), forgetting those whose endpoint is gone."""
    for slug in slugs:
        if slug in _routes and _load_route(slug) is None:
            _routes.pop(slug, None)


# What requests use is re-read before it goes stale (`warm_caches`): a sparse caller waits for no query.
_WARM_ROUTES = warm_caches.register(
    warm_caches.Warmed("routes", lambda: settings.PROXY_ROUTE_CACHE_S, _route_age, reload=_reload_routes)
)
_WARM_KEYS = warm_caches.register(
    warm_caches.Warmed("api keys", lambda: settings.API_KEY_CACHE_S, api_keys.grant_age, reload=api_keys.reload_grants)
)
_WARM_STOPS = warm_caches.register(
    warm_caches.Warmed(
        "budget stops",
        lambda: settings.BUDGET_STOPS_CACHE_S,
        lambda _: budget_stops.age_s(),
        reload_async=lambda _: budget_stops.reload(),
    )
)


@dataclass(frozen=True)
class _ColdStart:
    """The answer for a request let in to an endpoint that is scaled to zero, or whose replica is on its way
    after a scale to zero: it waits for a running replica (`_cold_start`)."""

    route: _Route


def _waits(route: _Route) -> bool:
    """Whether a request to `route` waits for a replica (asleep, or waking with none running yet)."""
    if route.status == EndpointStatus.IDLE:
        return True
    waking = (EndpointStatus.PENDING, EndpointStatus.STARTING)
    return route.scales_to_zero and route.status in waking and not (route.replicas or route.offline)


def _target(
    route: _Route | None, scope: dict[str, Any], path: str, *, caller_may_view: bool
) -> ProxyTarget | ProxyRefusal | _ColdStart:
    if route is None or (not route.public and not caller_may_view):
        return ProxyRefusal(404, "No such endpoint.")
    if _waits(route):
        return _ColdStart(route)
    lead = (route.replicas or route.offline or (None,))[0]
    if route.status != EndpointStatus.RUNNING or lead is None:
        return ProxyRefusal(503, f"Endpoint is {route.status}, not running.")
    query = scope.get("query_string", b"").decode("latin-1")
    return ProxyTarget(
        node_id=lead.node_id,
        port=lead.port,
        path=path + (f"?{query}" if query else ""),
        node_online=bool(route.replicas),
        meter=timeseries.workspace_series(route.workspace.pk),
        usage=usage_meter.Subject(route.workspace.pk, route.endpoint_id),
        replicas=route.replicas,
        routing=route.routing,
        queue=route.queue,
        adapters=route.adapters,
    )


def _public_answer_from_cache(
    scope: dict[str, Any], slug: str, path: str
) -> ProxyTarget | ProxyRefusal | _ColdStart | None:
    """The answer for a public endpoint whose route is cached (no database needed), else None."""
    route = _cached_route(slug)
    if route is None or not route.public:
        return None
    return _target(route, scope, path, caller_may_view=False)


def _key_answer(
    route: _Route, scope: dict[str, Any], path: str, grant: KeyGrant | None
) -> ProxyTarget | ProxyRefusal | _ColdStart:
    """The answer for an API key's request to a private endpoint (no database: its facts are loaded)."""
    if grant is None:
        return ProxyRefusal(401, BAD_KEY)
    if grant.workspace_id != route.workspace.pk:
        return ProxyRefusal(404, "No such endpoint.")
    if not key_access.may_invoke(grant, route.workspace.pk, route.endpoint_id):
        return ProxyRefusal(403, NO_INVOKE if not grant.allows("invoke") else NOT_THIS_ENDPOINT)
    answer = _target(route, scope, path, caller_may_view=True)
    if isinstance(answer, (ProxyTarget, _ColdStart)):
        key_access.mark_scope(scope, grant)
        limits = key_access.limits_of(grant, route.key_requests_per_min, route.key_tokens_per_min)
        scope[_KEY_USE] = (grant.key_id, route.endpoint_id, limits)
        scope[RATE_CALLER_SCOPE_KEY] = grant.key_id
    return answer


def _member_answer(
    route: _Route, scope: dict[str, Any], path: str, user: Any
) -> ProxyTarget | ProxyRefusal | _ColdStart:
    """The answer for a member calling a private endpoint with the origin cookie or an older DRF token: the
    endpoint's per-key limits apply to them as to each key (counted per user)."""
    answer = _target(route, scope, path, caller_may_view=can_view(user, route.workspace))
    if isinstance(answer, (ProxyTarget, _ColdStart)):
        limits = rate_limits.Limits(None, None, route.key_requests_per_min, route.key_tokens_per_min)
        caller = f"u{user.pk}"
        scope[_KEY_USE] = (caller, route.endpoint_id, limits)
        scope[RATE_CALLER_SCOPE_KEY] = caller
    return answer


def _key_answer_from_cache(
    scope: dict[str, Any], slug: str, path: str
) -> ProxyTarget | ProxyRefusal | _ColdStart | None:
    """The answer for an API key's request when its route and the key are cached, else None."""
    raw = key_access.presented_key(scope)
    route = _cached_route(slug) if raw else None
    if raw is None or route is None or route.public:
        return None
    grant = key_access.cached_key(raw)
    return None if grant is MISSING else _key_answer(route, scope, path, grant)


def _decide(scope: dict[str, Any], slug: str, path: str) -> ProxyTarget | ProxyRefusal | _ColdStart:
    """The answer for one request (sync: reads the database when the route or the caller needs it)."""
    route = _cached_route(slug) or _load_route(slug)
    if route is None or route.public:
        return _target(route, scope, path, caller_may_view=False)
    raw = key_access.presented_key(scope)
    if raw is not None:
        return _key_answer(route, scope, path, key_access.load_key(raw))
    user = origins.caller_on_origin(scope)
    if not user.is_authenticated:
        return ProxyRefusal(401, UNAUTHENTICATED)
    return _member_answer(route, scope, path, user)


_unwritten: dict[str, int] = {}  # slug → requests forwarded and not yet written
_written_at: dict[str, float] = {}  # slug → when this process last wrote its count


def _count_request(slug: str) -> bool:
    """Count one forwarded request; True when the count is due to be written now."""
    _unwritten[slug] = _unwritten.get(slug, 0) + 1
    now = time.monotonic()
    if now - _written_at.get(slug, -1e9) < settings.ENDPOINT_REQUESTS_FLUSH_S:
        return False
    _written_at[slug] = now
    if len(_written_at) >= _ROUTE_CACHE_MAX:
        _written_at.clear()
    return True


def database_sync_to_async(func: Any) -> Any:
    """`func` on the thread pool (its own connection per pool thread), not the pages' one sync thread."""
    return DatabaseSyncToAsync(func, thread_sensitive=False)


def _write_requests(slug: str) -> None:
    """Add this process's unwritten requests of `slug` to its row, with the time of the last one."""
    count = _unwritten.pop(slug, 0)
    if count:
        Endpoint.objects.filter(slug=slug).update(
            request_count=F("request_count") + count, last_request_at=timezone.now()
        )


@register_resolver
async def resolve_endpoint(scope: dict[str, Any]) -> Answer | None:
    """Claim requests for endpoint origins; send `/endpoints/<slug>/` paths elsewhere to the origin."""
    found = _slug_and_path(scope)
    if found is None:
        match = PATH_FORM.match(scope["path"])
        if match is None or origins.is_node_origin(scope):
            return None
        host = origin_names.ENDPOINT.host(match["slug"])
        return await database_sync_to_async(redirect_to_origin)(scope, host, match["rest"] or "/")
    # a cached public route, or a cached key on a cached route, leaves nothing to look up: no thread hop
    answer = (
        _public_answer_from_cache(scope, *found)
        or _key_answer_from_cache(scope, *found)
        or await database_sync_to_async(_decide)(scope, *found)
    )
    use = scope.pop(_KEY_USE, None)
    if isinstance(answer, (ProxyTarget, _ColdStart)) and use is not None:
        refusal = await rate_limits.admit(*use)
        if refusal is not None:
            usage = answer.usage if isinstance(answer, ProxyTarget) else _usage_of(answer.route)
            if usage is not None:
                usage_meter.observe_rate_limited(usage, use[0] if isinstance(use[0], int) else None)
            return _too_many(refusal)
        if isinstance(use[0], int) and api_keys.last_use_due(use[0]):
            await database_sync_to_async(api_keys.record_last_use)(use[0], key_access.client_ip(scope))
    if isinstance(answer, (ProxyTarget, _ColdStart)):
        subject = answer.usage if isinstance(answer, ProxyTarget) else _usage_of(answer.route)
        key_id = use[0] if use is not None and isinstance(use[0], int) else None
        if subject is not None:
            warm_caches.used(_WARM_STOPS, "stops")
        stop = await budget_stops.stopped(subject.workspace_id, key_id) if subject is not None else None
        if stop is not None:  # a budget's hard stop (the workspace's, or this key's): no round trip per request
            return _json_refusal(429, "budget_exceeded", stop["message"], None, extra=stop)
    if isinstance(answer, _ColdStart):
        answer = await _cold_start(found[0], answer.route, scope, found[1])
    if isinstance(answer, ProxyTarget) and _count_request(found[0]):
        _aside(database_sync_to_async(_write_requests)(found[0]))
    if not isinstance(answer, ProxyRefusal):
        warm_caches.used(_WARM_ROUTES, found[0])
        raw = key_access.presented_key(scope)
        if raw is not None:
            warm_caches.used(_WARM_KEYS, raw)
    return answer


_writes: set[asyncio.Future[Any]] = set()  # writes under way aside from the requests (held till done)


def _aside(write: Awaitable[Any]) -> None:
    """Run `write` (a database write a request caused) without the request waiting for it; a failure is logged."""
    task = asyncio.ensure_future(write)
    _writes.add(task)
    task.add_done_callback(_aside_done)


def _aside_done(task: asyncio.Future[Any]) -> None:
    _writes.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("a proxied request's bookkeeping write failed", exc_info=task.exception())


def _usage_of(route: _Route) -> usage_meter.Subject:
    return usage_meter.Subject(route.workspace.pk, route.endpoint_id)


# slug → the poller waking that endpoint and waiting for its replica, in this process (one per endpoint)
_pollers: dict[str, asyncio.Task] = {}


async def _cold_start(slug: str, route: _Route, scope: dict[str, Any], path: str) -> ProxyTarget | ProxyRefusal:
    """Wait for a running replica of a sleeping or waking endpoint, in its queue (`admission`: counted in its
    depth, at most its cold-start wait bound, then 429; the poller gives up after ENDPOINT_COLD_START_S: 503),
    with every other request waiting for it in this process; then the answer as for a running endpoint, which
    waits on in the queue for a free slot until the same deadline (`admission.DEADLINE_SCOPE_KEY`). A waiter
    that goes away (its client left) leaves the poller to the others."""
    gate = admission.gate(route.queue) if route.queue is not None else None
    if gate is not None and not gate.has_room():
        return _queue_refusal(gate.refuse("queue_full"))
    poller = _pollers.get(slug)
    if poller is None or poller.done() or poller.get_loop() is not asyncio.get_running_loop():
        poller = asyncio.ensure_future(_wake_and_wait(slug, route.endpoint_id))
        _pollers[slug] = poller
        poller.add_done_callback(lambda done: _pollers.pop(slug, None) if _pollers.get(slug) is done else None)
    if gate is None:
        found = await asyncio.shield(poller)
    else:
        bound = gate.policy.wait_s if gate.policy.cold_wait_s is None else gate.policy.cold_wait_s
        scope[admission.DEADLINE_SCOPE_KEY] = time.monotonic() + bound
        gate.cold += 1
        replica_load.PUBLISHER.ensure_running()  # (its queue figures go to the other processes and the pages)
        if admission.on_queued is not None:
            admission.on_queued()
        try:
            found = await asyncio.wait_for(asyncio.shield(poller), timeout=bound)
        except TimeoutError:
            return _queue_refusal(gate.refuse("queue_timeout", bound))
        finally:
            gate.cold -= 1
    if isinstance(found, ProxyRefusal):
        return found
    if found is None:
        return _cold_start_timeout()
    answer = _target(found, scope, path, caller_may_view=True)
    return answer if not isinstance(answer, _ColdStart) else _cold_start_timeout()


async def _wake_and_wait(slug: str, endpoint_id: UUID) -> _Route | ProxyRefusal | None:
    """The poller of one endpoint: wake it while it sleeps, re-read its route until a replica runs; the route
    then (or once it stopped or failed: the waiters get the usual 503), a refusal, or None at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.ENDPOINT_COLD_START_S
    while True:
        try:
            route = await database_sync_to_async(_load_route)(slug)
            if route is not None and route.status == EndpointStatus.IDLE:
                await database_sync_to_async(endpoint_wake)(endpoint_id=endpoint_id, reason="woken by a request")
                route = await database_sync_to_async(_load_route)(slug)
        except QuotaExceeded as exc:
            return _cold_start_refused(409, "quota_exceeded", str(exc))
        except PlacementError as exc:
            return _cold_start_refused(503, exc.code, str(exc))
        except Exception:  # the waiters get an answer, whatever went wrong here
            log.exception("cold start of endpoint %s failed", slug)
            return _cold_start_refused(503, "cold_start_failed", "The endpoint could not be started; retry later.")
        if route is None:
            return ProxyRefusal(404, "No such endpoint.")
        if route.status == EndpointStatus.RUNNING and (route.replicas or route.offline):
            return route
        if route.status not in (EndpointStatus.IDLE, EndpointStatus.PENDING, EndpointStatus.STARTING):
            return route  # stopped, failed, stopping: answered as usual (503 "not running")
        if loop.time() >= deadline:
            return None
        await asyncio.sleep(max(0.0, min(settings.ENDPOINT_COLD_START_POLL_S, deadline - loop.time())))


def _json_refusal(
    status: int, kind: str, message: str, retry_after: int | None, *, extra: dict[str, Any] | None = None
) -> ProxyRefusal:
    body: dict[str, Any] = {**(extra or {}), "type": kind, "message": message}
    headers: tuple[tuple[bytes, bytes], ...] = ()
    if retry_after is not None:
        body["retry_after"] = retry_after
        headers = ((b"retry-after", str(retry_after).encode()),)
    return ProxyRefusal(status, json.dumps({"error": body}), headers=headers, content_type=b"application/json")


def _cold_start_timeout() -> ProxyRefusal:
    """503 with Retry-After: no replica ran within ENDPOINT_COLD_START_S."""
    waited = int(settings.ENDPOINT_COLD_START_S)
    return _json_refusal(
        503,
        "cold_start_timeout",
        f"This endpoint was scaled to zero and is starting; no replica was ready within {waited} s. Retry shortly.",
        retry_after=30,
    )


def _cold_start_refused(status: int, kind: str, why: str) -> ProxyRefusal:
    """The endpoint is scaled to zero and could not start a replica (quotas: 409; no node: 503)."""
    message = f"This endpoint was scaled to zero and could not start again: {why}"
    return _json_refusal(status, kind, message, retry_after=60 if status == 503 else None)


def _queue_refusal(refusal: admission.Refusal) -> ProxyRefusal:
    """429 with Retry-After: the endpoint's queue is full or its wait bound passed."""
    return ProxyRefusal(429, refusal.body(), headers=refusal.headers(), content_type=b"application/json")


def _too_many(refusal: rate_limits.Refusal) -> ProxyRefusal:
    """429 with Retry-After (seconds) and a JSON error naming the limit."""
    body = {
        "error": {
            "type": "rate_limited",
            "limit": f"{refusal.limit}_per_minute",
            "message": (
                f"The {refusal.limit}-per-minute limit of this caller is reached; retry in {refusal.retry_after} s."
            ),
            "retry_after": refusal.retry_after,
        }
    }
    return ProxyRefusal(
        429,
        json.dumps(body),
        headers=((b"retry-after", str(refusal.retry_after).encode()),),
        content_type=b"application/json",
    )

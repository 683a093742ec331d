"""Cold starts in the proxy: requests to an endpoint scaled to zero wake it once and wait, all on one poller
per endpoint per process, for a running replica (bounded by ENDPOINT_COLD_START_S: then a 503 JSON error
with Retry-After); a refused start answers them with a JSON error; a waiter leaving disturbs no other."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from agent import protocol
from fleet import admission, origin_names
from fleet.balancer import Upstream
from fleet.models import Command, CommandType
from fleet.proxy import endpoint_routes, rate_limits
from fleet.proxy.resolvers import ProxyRefusal, ProxyTarget
from fleet.workloads import services as workloads
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.tasks import endpoints_heal_tick, endpoints_idle_tick
from kernel.exceptions import QuotaExceeded
from tenancy.models import Workspace
from tests.fleet import agent_side

LLAMA = protocol.CachedModel(model_id="meta-llama/Llama-3.2-1B", revision="main", path="/cache/llama", size_bytes=5)
SLUG = "ab" * 6


@pytest.fixture(autouse=True)
def _fresh(settings):
    settings.ENDPOINT_COLD_START_POLL_S = 0.01
    endpoint_routes.forget_routes()
    endpoint_routes._pollers.clear()
    yield
    endpoint_routes.forget_routes()
    endpoint_routes._pollers.clear()


def scope(slug: str = SLUG) -> dict:
    host = f"{origin_names.ENDPOINT.host(slug)}:8000".encode()
    return {"type": "http", "path": "/v1/models", "query_string": b"", "headers": [(b"host", host)]}


class FakeEndpoint:
    """Routes as the database would give them: asleep until woken, then starting for `polls` reads, then
    running on one replica; counts the reads and the wakes."""

    def __init__(self, polls: int = 3, wake_error: Exception | None = None) -> None:
        self.status, self.polls, self.wake_error = EndpointStatus.IDLE, polls, wake_error
        self.queue: admission.QueuePolicy | None = None  # its wait queue (None: none)
        self.reads = self.wakes = 0
        self.endpoint_id, self.workspace = uuid.uuid4(), Workspace(pk=uuid.uuid4(), name="w")

    def load(self, slug: str) -> endpoint_routes._Route:
        self.reads += 1
        if self.status == EndpointStatus.STARTING:
            self.polls -= 1
            if self.polls <= 0:
                self.status = EndpointStatus.RUNNING
        running = self.status == EndpointStatus.RUNNING
        return endpoint_routes._Route(
            public=True,
            endpoint_id=self.endpoint_id,
            key_requests_per_min=None,
            key_tokens_per_min=None,
            workspace=self.workspace,
            status=self.status,
            scales_to_zero=True,
            replicas=(Upstream("r1", uuid.uuid4(), 8100),) if running else (),
            offline=(),
            loaded_at=0.0,
            queue=self.queue,
        )

    def wake(self, *, endpoint_id, reason: str):
        assert (endpoint_id, reason) == (self.endpoint_id, "woken by a request")
        self.wakes += 1
        if self.wake_error is not None:
            raise self.wake_error
        if self.status == EndpointStatus.IDLE:
            self.status = EndpointStatus.STARTING


@pytest.fixture
def fake(monkeypatch) -> FakeEndpoint:
    fake = FakeEndpoint()
    monkeypatch.setattr(endpoint_routes, "_load_route", fake.load)
    monkeypatch.setattr(endpoint_routes, "endpoint_wake", fake.wake)
    return fake


async def waiters(fake: FakeEndpoint, n: int) -> list:
    route = fake.load(SLUG)
    return await asyncio.gather(*(endpoint_routes._cold_start(SLUG, route, scope(), "/v1/models") for _ in range(n)))


def test_many_waiting_requests_share_one_wake_and_one_poller(fake):
    answers = asyncio.run(waiters(fake, 50))
    assert all(isinstance(a, ProxyTarget) and a.port == 8100 for a in answers)
    assert fake.wakes == 1
    assert fake.reads <= 8  # the poller's reads, not one per waiting request
    assert endpoint_routes._pollers == {}  # gone once done


def test_an_idle_endpoint_is_a_cold_start_for_the_resolver_and_a_running_one_is_not(fake):
    fake.status = EndpointStatus.IDLE
    assert isinstance(
        endpoint_routes._target(fake.load(SLUG), scope(), "/", caller_may_view=True), endpoint_routes._ColdStart
    )
    fake.status = EndpointStatus.RUNNING
    assert isinstance(endpoint_routes._target(fake.load(SLUG), scope(), "/", caller_may_view=True), ProxyTarget)


def test_no_replica_within_the_bound_is_a_503_with_retry_after(fake, settings):
    settings.ENDPOINT_COLD_START_S = 0.05
    fake.polls = 10**9  # never runs
    (answer,) = asyncio.run(waiters(fake, 1))
    assert isinstance(answer, ProxyRefusal)
    assert (answer.status, answer.content_type) == (503, b"application/json")
    assert dict(answer.headers)[b"retry-after"] == b"30"
    error = json.loads(answer.message)["error"]
    assert error["type"] == "cold_start_timeout"
    assert "scaled to zero and is starting" in error["message"]


def test_a_start_the_quotas_refuse_answers_every_waiter_with_a_409(fake):
    fake.wake_error = QuotaExceeded(quota="gpus", label="GPUs", limit=1, in_use=1, asked=1)
    answers = asyncio.run(waiters(fake, 3))
    assert {(a.status, json.loads(a.message)["error"]["type"]) for a in answers} == {(409, "quota_exceeded")}
    assert "GPUs is limited to 1" in json.loads(answers[0].message)["error"]["message"]
    assert fake.wakes == 1


def test_a_waiter_that_leaves_disturbs_no_other(fake):
    fake.polls = 20

    async def main():
        route = fake.load(SLUG)
        leaving = asyncio.ensure_future(endpoint_routes._cold_start(SLUG, route, scope(), "/"))
        staying = asyncio.ensure_future(endpoint_routes._cold_start(SLUG, route, scope(), "/"))
        await asyncio.sleep(0.03)
        leaving.cancel()  # its client went away
        return await staying, leaving.cancelled()

    answer, cancelled = asyncio.run(main())
    assert cancelled
    assert isinstance(answer, ProxyTarget)
    assert fake.wakes == 1


@pytest.mark.django_db(transaction=True)
def test_requests_to_a_sleeping_endpoint_wake_it_once_and_are_proxied_once_it_runs(owner, cluster, node, settings):
    """On the real database: three requests at once, one start queued; the agent answers it; all three go."""
    agent_side.inventory(node, models=[LLAMA])
    endpoint = workloads.endpoint_create(
        actor=owner, cluster=cluster, model_id=LLAMA.model_id, min_replicas=0, idle_timeout_s=60, public=True
    )
    agent_side.result(endpoint.replicas.get().start_command, port=8001)
    then = timezone.now() - timedelta(seconds=120)
    Endpoint.objects.filter(pk=endpoint.pk).update(last_request_at=then)
    EndpointReplica.objects.filter(endpoint=endpoint).update(updated_at=then)
    endpoints_idle_tick()
    settings.ENDPOINT_DRAIN_S = 0
    endpoints_heal_tick()
    agent_side.result(endpoint.replicas.get().stop_command)
    assert Endpoint.objects.get(pk=endpoint.pk).status == EndpointStatus.IDLE
    starts = Command.objects.filter(command_type=CommandType.ENDPOINT_START)
    before = set(starts.values_list("pk", flat=True))

    def agent_starts_it() -> bool:
        # one read: the wake's start, once committed (reading the newest and then counting raced its commit)
        command = starts.exclude(pk__in=before).first()
        if command is None:
            return False
        agent_side.result(command, port=8002)
        return True

    async def main():
        requests = [asyncio.ensure_future(endpoint_routes.resolve_endpoint(scope(endpoint.slug))) for _ in range(3)]
        while not await database_sync_to_async(agent_starts_it)():
            await asyncio.sleep(0.02)
        return await asyncio.gather(*requests)

    answers = asyncio.run(main())
    assert [(type(a), a.port) for a in answers] == [(ProxyTarget, 8002)] * 3
    assert starts.count() == len(before) + 1
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.RUNNING
    assert endpoint.events.filter(kind="endpoint.cold_start").count() == 1


def test_a_key_over_its_rate_limit_is_refused_before_it_wakes_anything(fake, monkeypatch):
    def decide(request_scope, slug, path):
        request_scope[endpoint_routes._KEY_USE] = (7, fake.endpoint_id, None)  # a key's request, let in
        return endpoint_routes._ColdStart(fake.load(slug))

    async def over_limit(key_id, endpoint_id, limits):
        return rate_limits.Refusal("requests", 12)

    monkeypatch.setattr(endpoint_routes, "_decide", decide)
    monkeypatch.setattr(endpoint_routes.rate_limits, "admit", over_limit)
    monkeypatch.setattr(endpoint_routes.usage_meter, "observe_rate_limited", lambda subject, key_id: None)
    answer = asyncio.run(endpoint_routes.resolve_endpoint(scope()))
    assert answer.status == 429
    assert fake.wakes == 0


def test_requests_wait_for_the_start_in_the_endpoint_s_queue_within_its_depth_and_wait_bound(fake):
    fake.queue = admission.QueuePolicy(str(fake.endpoint_id), limit=4, depth=3, wait_s=30.0, cold_wait_s=30.0)
    fake.polls = 40  # (a start of some 0.4 s)

    async def main() -> tuple[list, int]:
        route = fake.load(SLUG)
        held = [asyncio.ensure_future(endpoint_routes._cold_start(SLUG, route, scope(), "/")) for _ in range(5)]
        await asyncio.sleep(0.05)
        waiting = admission.gate(fake.queue).queued  # counted in the queue while the replica starts
        return [await h for h in held], waiting

    try:
        answers, waiting = asyncio.run(main())
        assert waiting == 3
        assert sum(isinstance(a, ProxyTarget) for a in answers) == 3  # held through the start, then answered
        refused = [a for a in answers if isinstance(a, ProxyRefusal)]
        assert [(a.status, json.loads(a.message)["error"]["type"]) for a in refused] == [(429, "queue_full")] * 2
        assert all(dict(a.headers)[b"retry-after"] for a in refused)
        assert admission.gate(fake.queue).queued == 0

        fake.status, fake.polls = EndpointStatus.IDLE, 10**9  # a start that takes longer than the wait bound
        fake.queue = admission.QueuePolicy(str(fake.endpoint_id), limit=4, depth=3, wait_s=30.0, cold_wait_s=0.05)
        (late,) = asyncio.run(waiters(fake, 1))
        assert (late.status, json.loads(late.message)["error"]["type"]) == (429, "queue_timeout")
        assert "within 0.05 s" in json.loads(late.message)["error"]["message"]
    finally:
        admission.discard()

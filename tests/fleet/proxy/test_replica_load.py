"""Per-replica load shared by the web processes (`fleet.replica_load`): each process's snapshot in Redis
with a TTL (a dead process's figures vanish), the sum over processes, tokens per second over a window, the
relay counting a request's tokens for the replica that answered, and the publisher the relay starts."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis
from django.conf import settings

from fleet import balancer, replica_load
from fleet.balancer import Lease, Upstream
from fleet.replica_load import LoadPublisher, ReplicaLoad
from fleet.usage import meter as usage_meter
from tests.fleet.proxy.test_balancer import agents, call  # noqa: F401  (the stand-in agents fixture)
from tests.support.processes import wait_until


@pytest.fixture
def publishers():
    """Make publishers standing for web processes; their snapshots are deleted afterwards."""
    made: list[LoadPublisher] = []

    def make(name: str) -> LoadPublisher:
        made.append(LoadPublisher(name=f"test-{name}-{uuid.uuid4().hex[:6]}"))
        return made[-1]

    yield make
    for publisher in made:
        publisher.publish({})


def redis_client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def test_a_snapshot_holds_this_process_figures_and_expires_with_its_ttl(publishers, settings):
    settings.REPLICA_LOAD_TTL_S = 0.5
    here = publishers("a")
    upstream = Upstream(key="r-" + uuid.uuid4().hex[:8], node_id=uuid.uuid4(), port=1)
    leases = [Lease((upstream,)) for _ in range(3)]
    for lease in leases:
        lease.take()
    try:
        replica_load.count_tokens(upstream.key, 40)
        here.publish(here.sample(now=100.0))
        found = replica_load.read()[upstream.key]
        assert sum(found.decisions) == 3  # (each routing decision's time, by bucket)
        assert found == ReplicaLoad(
            in_flight=3, tokens_per_s=0.0, tokens_total=40, routed=3, decisions=found.decisions
        )  # (and the 3 requests routed there)
        assert 0 < found.decision_p99_us <= 5_000
        assert 0 < redis_client().pttl(here.key) <= 500  # the hash dies with its TTL unless written again
    finally:
        for lease in leases:
            lease.release()
    # the process stops publishing (it died): its figures vanish, nothing stays counted in flight
    wait_until(lambda: upstream.key not in replica_load.read(), timeout=10, what="the snapshot expired")
    assert not redis_client().exists(here.key)


def test_the_figures_are_summed_over_the_live_processes(publishers):
    a, b = publishers("a"), publishers("b")
    a.publish({"r1": (2, 100, 5.0), "r2": (1, 0, 0.0)})
    b.publish({"r1": (3, 50, 2.5)})
    loads = replica_load.read()
    assert loads["r1"] == ReplicaLoad(in_flight=5, tokens_per_s=7.5, tokens_total=150)
    assert loads["r2"] == ReplicaLoad(in_flight=1, tokens_per_s=0.0, tokens_total=0)
    b.publish({})  # nothing left in b: its snapshot is deleted at once, not left to its TTL
    assert replica_load.read()["r1"] == ReplicaLoad(in_flight=2, tokens_per_s=5.0, tokens_total=100)
    assert not redis_client().exists(b.key)


def test_tokens_per_second_over_the_window_and_idle_replicas_forgotten(publishers, settings):
    settings.REPLICA_LOAD_WINDOW_S = 10.0
    here = publishers("a")
    assert here.sample(now=0.0) == {}
    replica_load.count_tokens("r1", 100)
    assert here.sample(now=5.0) == {"r1": (0, 100, 20.0, 0, 0)}  # 100 tokens in 5 s
    replica_load.count_tokens("r1", 60)
    assert here.sample(now=10.0) == {"r1": (0, 160, 16.0, 0, 0)}  # 160 since the sample 10 s ago
    assert here.sample(now=15.0) == {"r1": (0, 160, 6.0, 0, 0)}  # base: the sample at 5 s (100): 60 in 10 s
    assert here.sample(now=19.0) == {"r1": (0, 160, 60 / 14, 0, 0)}  # still based at 5 s (the one at 10 s: 9 s old)
    # a whole window (since 10 s) with no token and nothing in flight: dropped (no growth per replica)
    assert here.sample(now=20.0) == {}
    assert "r1" not in replica_load._tokens


@pytest.mark.django_db  # (finishing outside an event loop writes the usage at once)
def test_a_request_s_completion_tokens_count_for_the_replica_that_answered():
    subject = usage_meter.Subject(workspace_id=uuid.uuid4(), endpoint_id=uuid.uuid4())
    usage = usage_meter.RequestUsage(subject, None)
    usage.replica = "r-answered"
    usage.head(200, [(b"content-type", b"application/json")])
    usage.feed(b'{"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 12}}')
    usage.finish(complete=True)
    assert replica_load._tokens["r-answered"] == 12


@pytest.mark.asyncio
async def test_the_relay_starts_the_publisher_and_in_flight_requests_show_then_vanish(agents, settings):  # noqa: F811
    settings.REPLICA_LOAD_PUBLISH_S = 0.05
    (streaming, _) = agents("stream")
    request = asyncio.ensure_future(call((streaming,)))

    async def shown(in_flight: int) -> None:
        for _ in range(400):
            load = (await asyncio.to_thread(replica_load.read)).get(streaming.key, ReplicaLoad())
            if load.in_flight == in_flight:
                return
            await asyncio.sleep(0.025)
        raise AssertionError(f"{streaming.key} never showed {in_flight} in flight: {load}")

    try:
        await shown(1)  # published by the loop the relay started, read as any other process would
        assert balancer.outstanding(streaming.key) == 1
    finally:
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
    await shown(0)  # the request ended: its count is gone from the shared figures too
    assert replica_load.PUBLISHER._task is not None
    assert not replica_load.PUBLISHER._task.done()


@pytest.mark.asyncio
async def test_a_failed_publish_is_logged_and_the_next_pass_runs_and_an_ended_loop_starts_again(settings, caplog):
    settings.REPLICA_LOAD_PUBLISH_S = 0.01
    publisher = LoadPublisher(name="test-flaky")
    written: list[dict] = []
    calls = iter([redis.ConnectionError("Redis away")])

    def publish(snapshot: dict, queues: dict | None = None) -> None:
        failure = next(calls, None)
        if failure is not None:
            raise failure
        written.append(snapshot)

    publisher.publish = publish  # type: ignore[method-assign]
    publisher.ensure_running()
    for _ in range(500):
        if written:
            break
        await asyncio.sleep(0.01)
    assert written  # the pass after the failure wrote
    assert "publishing replica load failed" in caplog.text
    first = publisher._task
    first.cancel()  # however it ended, the next request starts it again
    with pytest.raises(asyncio.CancelledError):
        await first
    publisher.ensure_running()
    assert publisher._task is not first
    assert not publisher._task.done()
    publisher._task.cancel()

"""Is anything dispatching commands? The Celery worker's heartbeat and the broker's queue depth.

Writing: every worker's consumer, while it consumes, records the wall-clock time of its event loop's
latest tick in one Redis hash on the broker (`HEARTBEATS_KEY`, field = worker hostname), every
WORKER_HEARTBEAT_INTERVAL_S (`cleverthis.celery.WorkerHeartbeat`). The beat comes from the loop itself,
so it stops whenever commands stop: a dead worker, a worker reconnecting to a lost broker, a stuck loop.
Cheap (one pipelined HSET + EXPIRE) and needs no Celery events, no `inspect` broadcast, no beat.

Reading (`dispatch_status`): one pipelined round trip to the broker gets the heartbeats and the length
of every task queue the worker consumes. /healthz, /metrics and the pages' banner all use it. Short
socket timeouts keep a page fast when Redis is gone; that is then reported too (`broker_reachable`).

Ages compare the worker's clock with the reader's (NTP keeps them within far less than the threshold).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import redis
from django.conf import settings
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

HEARTBEATS_KEY = "cleverthis:worker-heartbeats"
# A worker's entry outlives it this long (then "no worker has reported" takes over).
HEARTBEATS_TTL_S = 24 * 3600
# kombu's Redis transport keeps priorities 3, 6 and 9 in lists of their own: "<queue>\x06\x16<priority>".
PRIORITY_SEPARATOR = "\x06\x16"
PRIORITY_STEPS = (3, 6, 9)
BROKER_TIMEOUT_S = 0.5


def worker_queues() -> list[str]:
    """The queues the worker consumes: the default one and every routed one (the Procfile's -Q)."""
    routed = {route["queue"] for route in settings.CELERY_TASK_ROUTES.values() if "queue" in route}
    return [settings.CELERY_TASK_DEFAULT_QUEUE, *sorted(routed - {settings.CELERY_TASK_DEFAULT_QUEUE})]


@functools.lru_cache(maxsize=4)
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=BROKER_TIMEOUT_S, socket_connect_timeout=BROKER_TIMEOUT_S)


def broker_client() -> redis.Redis:
    """A Redis client on the Celery broker with short timeouts (one connection pool per URL and process)."""
    return _client(settings.CELERY_BROKER_URL)


def heartbeat_record(*, hostname: str, at: float | None = None) -> None:
    """Record that worker `hostname` consumed at `at` (now by default); raises redis errors."""
    pipe = broker_client().pipeline(transaction=False)
    pipe.hset(HEARTBEATS_KEY, hostname, repr(time.time() if at is None else at))
    pipe.expire(HEARTBEATS_KEY, HEARTBEATS_TTL_S)
    pipe.execute()


def heartbeats_prune(*, older_than_s: float = HEARTBEATS_TTL_S) -> int:
    """Forget workers that last reported more than `older_than_s` ago; returns how many."""
    client = broker_client()
    cutoff = time.time() - older_than_s
    old = [name for name, at in client.hgetall(HEARTBEATS_KEY).items() if _as_float(at) < cutoff]
    return client.hdel(HEARTBEATS_KEY, *old) if old else 0


def _as_float(raw: bytes | str) -> float:
    try:
        return float(raw)
    except (TypeError, ValueError):
        return 0.0


@dataclass(frozen=True)
class DispatchStatus:
    """What the broker says about dispatch right now (see `dispatch_status`)."""

    broker_reachable: bool
    # worker hostname -> seconds since its last heartbeat
    worker_ages: dict[str, float]
    # queue -> tasks waiting (None when the broker is unreachable)
    queue_depth: dict[str, int] | None
    stale_after_s: float

    @property
    def heartbeat_age_s(self) -> float | None:
        """Seconds since the freshest heartbeat of any worker; None when none has reported."""
        return min(self.worker_ages.values()) if self.worker_ages else None

    @property
    def workers_alive(self) -> int:
        return sum(1 for age in self.worker_ages.values() if age <= self.stale_after_s)

    @property
    def queued(self) -> int:
        return sum((self.queue_depth or {}).values())

    @property
    def problem(self) -> str | None:
        """Why commands are not being dispatched, as the banner says it; None when they are (or nothing waits).

        A control plane whose worker never reported and has nothing queued (a fresh install) is not a problem.
        """
        if not self.broker_reachable:
            return "Commands are not being dispatched: the broker (Redis) does not answer."
        age = self.heartbeat_age_s
        if age is None:
            if self.queued:
                return f"Commands are not being dispatched: no worker has reported, and {self.queued} tasks wait."
            return None
        if age > self.stale_after_s:
            return f"Commands are not being dispatched: the worker last reported {age:.0f} s ago."
        return None

    def as_json(self) -> dict:
        """The /healthz form (no worker names: /healthz answers anyone)."""
        age = self.heartbeat_age_s
        return {
            "ok": self.problem is None,
            "broker_reachable": self.broker_reachable,
            "worker_heartbeat_age_s": None if age is None else round(age, 1),
            "workers_alive": self.workers_alive,
            "queue_depth": self.queue_depth,
        }


def dispatch_status(*, now: float | None = None) -> DispatchStatus:
    """Heartbeats and queue depths from the broker in one round trip; never raises for a broker that is gone."""
    now = time.time() if now is None else now
    stale = float(settings.WORKER_HEARTBEAT_STALE_S)
    queues = worker_queues()
    pipe = broker_client().pipeline(transaction=False)
    pipe.hgetall(HEARTBEATS_KEY)
    for queue in queues:
        pipe.llen(queue)
        for step in PRIORITY_STEPS:
            pipe.llen(f"{queue}{PRIORITY_SEPARATOR}{step}")
    try:
        beats, *lengths = pipe.execute()
    except redis.RedisError as exc:
        logger.debug("dispatch status: broker unreachable: %s", exc)
        return DispatchStatus(broker_reachable=False, worker_ages={}, queue_depth=None, stale_after_s=stale)
    per_queue = 1 + len(PRIORITY_STEPS)
    depth = {queue: sum(lengths[i * per_queue : (i + 1) * per_queue]) for i, queue in enumerate(queues)}
    ages = {
        (name.decode() if isinstance(name, bytes) else name): max(0.0, now - _as_float(at))
        for name, at in beats.items()
    }
    return DispatchStatus(broker_reachable=True, worker_ages=ages, queue_depth=depth, stale_after_s=stale)


class DispatchCollector(Collector):
    """/metrics gauges read from the broker at scrape time: broker up, each worker's heartbeat age, queue depths."""

    def collect(self) -> Iterator[Metric]:
        status = dispatch_status()
        up = GaugeMetricFamily("cleverthis_broker_up", "1 when the Celery broker (Redis) answers, else 0.")
        up.add_metric([], 1 if status.broker_reachable else 0)
        yield up
        ages = GaugeMetricFamily(
            "cleverthis_worker_heartbeat_age_seconds",
            "Seconds since the Celery worker's consumer last reported (stops while it is not consuming).",
            labels=["worker"],
        )
        for name, age in sorted(status.worker_ages.items()):
            ages.add_metric([name], age)
        yield ages
        depth = GaugeMetricFamily("cleverthis_celery_queue_depth", "Tasks waiting in a Celery queue.", labels=["queue"])
        for queue, n in sorted((status.queue_depth or {}).items()):
            depth.add_metric([queue], n)
        yield depth

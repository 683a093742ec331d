"""Whether commands are being dispatched: the worker heartbeat and queue depths in /healthz, /metrics and
the pages' banner, and the kombu fix that keeps a worker alive when its broker goes away.

The worker's own heartbeat (a real worker recording it) is in tests/project/test_celery.py; a worker
surviving Redis restarts under dispatch load in tests/e2e/test_worker_broker_loss.py.
"""

from __future__ import annotations

import time
import uuid

import pytest
import redis
from kombu import Connection
from prometheus_client.parser import text_string_to_metric_families

from cleverthis.dispatch_health import (
    HEARTBEATS_KEY,
    PRIORITY_SEPARATOR,
    PRIORITY_STEPS,
    broker_client,
    dispatch_status,
    heartbeat_record,
    heartbeats_prune,
    worker_queues,
)
from tests.support.processes import free_port

pytestmark = pytest.mark.django_db


def _broker_keys() -> list[str]:
    queues = worker_queues()
    return [HEARTBEATS_KEY, *queues, *(f"{q}{PRIORITY_SEPARATOR}{step}" for q in queues for step in PRIORITY_STEPS)]


@pytest.fixture
def broker():
    """The test Redis as the broker, without heartbeats or queued tasks before and after the test."""
    client = broker_client()
    client.delete(*_broker_keys())
    yield client
    client.delete(*_broker_keys())


@pytest.fixture
def broker_gone(settings):
    """A broker URL nothing listens on."""
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{free_port()}/0"


def test_queues_are_the_ones_the_worker_consumes():
    assert worker_queues() == ["default", "dispatch"]


def test_status_reads_heartbeats_and_queue_depths_of_every_priority(broker, settings):
    settings.WORKER_HEARTBEAT_STALE_S = 30
    now = time.time()
    heartbeat_record(hostname="w1@a", at=now - 5)
    heartbeat_record(hostname="w2@b", at=now - 100)
    broker.rpush("dispatch", "t1", "t2")
    broker.rpush(f"dispatch{PRIORITY_SEPARATOR}6", "t3")
    broker.rpush("default", "t4")
    status = dispatch_status(now=now)
    assert status.broker_reachable
    assert status.worker_ages == pytest.approx({"w1@a": 5, "w2@b": 100}, abs=0.01)
    assert status.heartbeat_age_s == pytest.approx(5, abs=0.01)
    assert status.workers_alive == 1
    assert status.queue_depth == {"default": 1, "dispatch": 3}
    assert status.problem is None


@pytest.mark.parametrize(
    ("age", "queued", "problem"),
    [
        (None, 0, None),  # a fresh install: no worker yet, nothing waits
        (None, 2, "Commands are not being dispatched: no worker has reported, and 2 tasks wait."),
        (10, 5, None),  # busy, but consuming
        (95, 0, "Commands are not being dispatched: the worker last reported 95 s ago."),
    ],
)
def test_problem_says_why_commands_are_not_dispatched(broker, settings, age, queued, problem):
    settings.WORKER_HEARTBEAT_STALE_S = 30
    now = time.time()
    if age is not None:
        heartbeat_record(hostname="w@h", at=now - age)
    if queued:
        broker.rpush("dispatch", *[f"t{i}" for i in range(queued)])
    status = dispatch_status(now=now)
    assert status.problem == problem
    assert status.as_json()["ok"] is (problem is None)


def test_a_broker_that_does_not_answer_is_reported_not_raised(broker_gone):
    status = dispatch_status()
    assert not status.broker_reachable
    assert status.queue_depth is None
    assert status.problem == "Commands are not being dispatched: the broker (Redis) does not answer."


def test_prune_forgets_workers_gone_for_long(broker):
    now = time.time()
    heartbeat_record(hostname="old@h", at=now - 2 * 24 * 3600)
    heartbeat_record(hostname="new@h", at=now)
    assert heartbeats_prune() == 1
    assert set(dispatch_status().worker_ages) == {"new@h"}
    assert 0 < broker.ttl(HEARTBEATS_KEY) <= 24 * 3600


# --------------------------------------------------------------------------------------------------
# /healthz


def test_healthz_reports_the_worker_heartbeat_and_queue_depth(client, broker):
    heartbeat_record(hostname="w@h", at=time.time() - 3)
    broker.rpush("dispatch", "t1")
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    dispatch = body["dispatch"]
    assert dispatch["ok"] is True
    assert dispatch["broker_reachable"] is True
    assert 2 <= dispatch["worker_heartbeat_age_s"] < 60
    assert dispatch["workers_alive"] == 1
    assert dispatch["queue_depth"] == {"default": 0, "dispatch": 1}
    assert "w@h" not in response.content.decode()  # /healthz answers anyone: no worker names


def test_healthz_stays_ok_for_load_balancers_while_dispatch_is_stalled(client, broker, settings):
    settings.WORKER_HEARTBEAT_STALE_S = 30
    heartbeat_record(hostname="w@h", at=time.time() - 300)
    body = client.get("/healthz").json()
    assert body["status"] == "ok"
    assert body["dispatch"]["ok"] is False
    assert body["dispatch"]["workers_alive"] == 0


def test_healthz_answers_while_the_broker_is_gone(client, broker_gone):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["dispatch"] == {
        "ok": False,
        "broker_reachable": False,
        "worker_heartbeat_age_s": None,
        "workers_alive": 0,
        "queue_depth": None,
    }


# --------------------------------------------------------------------------------------------------
# /metrics


def test_metrics_report_broker_worker_heartbeats_and_queue_depths(client, broker, settings):
    settings.METRICS_TOKEN = "s3cret"
    heartbeat_record(hostname="w@h", at=time.time() - 42)
    broker.rpush("dispatch", "t1", "t2")
    broker.rpush(f"default{PRIORITY_SEPARATOR}9", "t3")
    text = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").content.decode()
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert found[("cleverthis_broker_up", ())] == 1
    assert 41 <= found[("cleverthis_worker_heartbeat_age_seconds", (("worker", "w@h"),))] < 100
    assert found[("cleverthis_celery_queue_depth", (("queue", "dispatch"),))] == 2
    assert found[("cleverthis_celery_queue_depth", (("queue", "default"),))] == 1


def test_metrics_say_the_broker_is_down(client, broker_gone, settings):
    settings.METRICS_TOKEN = "s3cret"
    text = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").content.decode()
    assert "cleverthis_broker_up 0.0" in text


# --------------------------------------------------------------------------------------------------
# the pages' banner


def test_pages_show_a_banner_while_the_worker_has_not_reported(client, owner, broker, settings):
    settings.WORKER_HEARTBEAT_STALE_S = 30
    client.force_login(owner)
    heartbeat_record(hostname="w@h", at=time.time() - 3)
    page = client.get("/").content.decode()
    assert 'id="dispatch-banner"' in page  # polled, so it also goes away without a reload
    assert "data-dispatch-problem" not in page

    heartbeat_record(hostname="w@h", at=time.time() - 139)
    page = client.get("/").content.decode()
    assert "Commands are not being dispatched: the worker last reported 139 s ago." in page
    partial = client.get("/dispatch-banner").content.decode()
    assert "the worker last reported 139 s ago" in partial
    assert "<html" not in partial

    heartbeat_record(hostname="w@h", at=time.time())
    assert "data-dispatch-problem" not in client.get("/dispatch-banner").content.decode()


def test_banner_when_tasks_wait_and_no_worker_ever_reported(client, owner, broker):
    client.force_login(owner)
    assert "data-dispatch-problem" not in client.get("/").content.decode()
    broker.rpush("dispatch", "t1", "t2", "t3")
    assert "no worker has reported, and 3 tasks wait" in client.get("/").content.decode()


def test_banner_when_the_broker_is_gone(client, owner, broker_gone):
    client.force_login(owner)
    assert "the broker (Redis) does not answer" in client.get("/").content.decode()


def test_banner_partial_needs_a_signed_in_user(client):
    assert client.get("/dispatch-banner").status_code == 302


# --------------------------------------------------------------------------------------------------
# cleverthis.kombu_fixes


def test_a_channel_closed_after_its_connection_raises_a_connection_error_not_attribute_error(settings):
    """The worker's crash, step by step: a message taken and not acknowledged (acks_late); the connection
    collected, which detaches the transport (in the worker the channel's own close failed there, on the
    BRPOP Redis dropped, so the channel outlived it); then the channel closed: the restore needs a pool."""
    import cleverthis.celery  # noqa: F401  (applies the fix, as in the worker)

    queue = f"kombu-fix-{uuid.uuid4().hex}"
    connection = Connection(settings.CELERY_BROKER_URL)
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    try:
        channel = connection.channel()
        producer = connection.Producer(channel)
        simple = connection.SimpleQueue(queue, channel=channel)
        producer.publish({"n": 1}, routing_key=queue)
        message = simple.get(timeout=5)  # delivered, unacknowledged: kept for restore
        assert message.payload == {"n": 1}
        connection.transport.client = None  # what `collect()` leaves behind: the transport detached
        with pytest.raises(redis.ConnectionError, match="transport detached"):
            channel.close()
        connection.maybe_close_channel(channel)  # the worker's own call: ignores connection errors
    finally:
        client.delete(queue, "unacked", "unacked_index", "unacked_mutex", f"_kombu.binding.{queue}")
        client.close()

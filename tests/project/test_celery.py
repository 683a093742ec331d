"""A task runs on a real Celery worker through the real Redis broker."""

from __future__ import annotations

import uuid

import pytest

from cleverthis.celery import app, ping
from tests.support.processes import celery_worker


@pytest.fixture
def worker(tmp_path):
    proc = celery_worker(tmp_path, queues="default")
    yield proc
    proc.stop()


def test_task_round_trips_through_a_real_worker(worker):
    token = uuid.uuid4().hex
    result = ping.delay(token)
    try:
        assert result.get(timeout=60) == token, worker.log()
    finally:
        result.forget()
    assert "cleverthis.ping" in worker.log()


def test_broker_is_redis_and_serializer_json():
    assert app.conf.broker_url.startswith("redis://")
    assert app.conf.task_serializer == "json"


def test_a_lost_broker_is_retried_forever_and_often():
    """Never give up on the broker, and try it again at least every few seconds (cleverthis.celery)."""
    assert app.conf.broker_connection_retry is True
    assert app.conf.broker_connection_retry_on_startup is True
    assert app.conf.broker_connection_max_retries is None
    assert app.conf.worker_consumer == "cleverthis.celery:ReconnectingConsumer"


def test_beat_keeps_its_schedule_in_its_own_checkout_or_run(tmp_path):
    """No schedule file shared between checkouts: by default it is under this checkout's var/, in a test
    run under the run's directory; beat makes the directory it needs."""
    import json
    import os
    import subprocess
    import sys

    from django.conf import settings

    from tests.support.processes import REPO_ROOT, ManagedProcess, wait_until

    env = {k: v for k, v in os.environ.items() if k != "CELERY_BEAT_SCHEDULE_FILENAME"}
    env["DJANGO_SETTINGS_MODULE"] = "cleverthis.settings.base"
    code = "from cleverthis.celery import app; import json; print(json.dumps(app.conf.beat_schedule_filename))"
    default = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout
    )
    assert default == str(REPO_ROOT / "var" / "celerybeat-schedule")
    assert settings.CELERY_BEAT_SCHEDULE_FILENAME.startswith(settings.TEST_RUN_DIR)

    schedule = tmp_path / "not-yet" / "beat-schedule"
    beat = ManagedProcess(
        "celery-beat",
        [sys.executable, "-m", "celery", "-A", "cleverthis", "beat", "--loglevel=INFO"],
        log_dir=tmp_path,
        env={"CELERY_BEAT_SCHEDULE_FILENAME": str(schedule)},
    )
    try:
        wait_until(lambda: any(schedule.parent.glob("beat-schedule*")) or not beat.alive(), timeout=60, what="beat")
        assert beat.alive(), beat.log()
    finally:
        beat.stop()
    assert not list(REPO_ROOT.glob("celerybeat-schedule*"))


def test_a_consuming_worker_records_its_heartbeat(worker):
    """The consumer's heartbeat step writes to the broker while it consumes (cleverthis.dispatch_health)."""
    from cleverthis.dispatch_health import HEARTBEATS_KEY, broker_client, dispatch_status
    from tests.support.processes import wait_until

    def beats() -> dict[str, float]:
        return {name: age for name, age in dispatch_status().worker_ages.items() if name.startswith("celery-worker@")}

    try:
        wait_until(lambda: bool(beats()), timeout=60, what="a heartbeat of the worker")
        name, age = next(iter(beats().items()))
        assert age < 30, worker.log()
        assert dispatch_status().workers_alive >= 1
    finally:
        worker.stop()
        for name in beats():
            broker_client().hdel(HEARTBEATS_KEY, name)

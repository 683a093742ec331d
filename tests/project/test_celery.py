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

"""Beat rides through a Redis restart: the tasks due while Redis was away are sent once it is back, and
its log holds no traceback (Celery's own scheduler logged a chained one ending in "IndexError: pop from
empty list", kombu's empty pool of channels, for every entry due while Redis was away).

Real `celery beat` against a Redis of the test's own, which the test kills and starts again.
"""

from __future__ import annotations

import sys
import time

import pytest

from tests.support.live import subprocess_env
from tests.support.private_redis import PrivateRedis
from tests.support.processes import ManagedProcess, wait_until

pytestmark = pytest.mark.integration


def _sent(log: str) -> int:
    return log.count("Sending due task")


def test_beat_sends_again_after_redis_restarts_without_a_traceback(tmp_path):
    redis = PrivateRedis(tmp_path)
    redis.start()
    env = subprocess_env(
        TEST_REDIS_URL=redis.url, CELERY_BEAT_SCHEDULE_FILENAME=str(tmp_path / "schedule"), LOG_LEVEL="INFO"
    )
    beat = ManagedProcess(
        "beat",
        [sys.executable, "-m", "celery", "-A", "cleverthis", "beat", "--loglevel=INFO"],
        env=env,
        log_dir=tmp_path,
    )
    try:
        wait_until(lambda: _sent(beat.log()) >= 3, timeout=60, what="beat sends its first tasks")
        redis.kill()
        before = _sent(beat.log())
        wait_until(lambda: _sent(beat.log()) > before, timeout=60, what="a task due while Redis is away")
        time.sleep(3)  # Redis stays away a while: the publishes retry meanwhile
        redis.start()
        back = _sent(beat.log())
        wait_until(lambda: _sent(beat.log()) >= back + 3, timeout=60, what="beat sends again after the restart")
        assert beat.alive()
        log = beat.log()
        assert "Traceback" not in log, log[-4000:]
        assert "IndexError" not in log, log[-4000:]
    finally:
        beat.stop()
        redis.stop()

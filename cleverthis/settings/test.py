"""Test settings: the same real PostgreSQL and Redis, isolated by Redis database and key prefix.

Tests use Redis database 15 (TEST_REDIS_URL) so a locally running control plane on database 0 never
consumes a test's tasks or channel messages.

The files a control plane writes (Prometheus multiprocess files, the beat schedule) go to one temporary
directory per test session, CLEVERTHIS_TEST_RUN_DIR: the processes the tests start inherit it, and the
session removes it at its end (tests/conftest.py).
"""

from __future__ import annotations

import os
import tempfile

os.environ["REDIS_URL"] = os.environ.get("TEST_REDIS_URL") or "redis://127.0.0.1:6379/15"
# True in the process that made the directory (the test session), which removes it at the end.
TEST_RUN_DIR_OWNED = not os.environ.get("CLEVERTHIS_TEST_RUN_DIR")
if TEST_RUN_DIR_OWNED:
    os.environ["CLEVERTHIS_TEST_RUN_DIR"] = tempfile.mkdtemp(prefix="cleverthis-test-")
TEST_RUN_DIR = os.environ["CLEVERTHIS_TEST_RUN_DIR"]
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", os.path.join(TEST_RUN_DIR, "metrics"))
os.environ.setdefault("CELERY_BEAT_SCHEDULE_FILENAME", os.path.join(TEST_RUN_DIR, "celerybeat-schedule"))

# DEBUG is off in tests, as in production, so the key must be one production would accept: one for tests
# alone (the processes the tests start use it too, whether they inherit it or read it here).
os.environ.setdefault("SECRET_KEY", "test-settings-only-4f1c2b9e7d3a6085e2c1b4a79f0d3e6c8b5a2f1e")

from cleverthis.settings.base import *  # noqa: E402, F403
from cleverthis.settings.base import CACHES, CHANNEL_LAYERS  # noqa: E402
from cleverthis.settings.env import env_float  # noqa: E402

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = "cleverthis-test:channels:"
CACHES["default"]["KEY_PREFIX"] = "cleverthis-test"
# The suite registers many agents and signs in often from 127.0.0.1 (e2e tests start web servers with
# these settings): limits no test reaches. Per-second windows keep their counters in Redis for a second or two.
# The throttling tests lower them for themselves.
AGENT_REGISTER_RATE = "100000/s"
SIGN_IN_RATE = "100000/s"
# Web servers the tests stop: no load balancer to wait for, a short drain (tests that drain set their own).
WEB_DRAIN_DEADLINE_S = env_float("WEB_DRAIN_DEADLINE_S", 5.0)
WEB_DRAIN_LB_S = env_float("WEB_DRAIN_LB_S", 0.0)

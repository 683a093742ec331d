"""Test settings: the same real PostgreSQL and Redis, isolated by Redis database and key prefix.

Tests use Redis database 15 (TEST_REDIS_URL) so a locally running control plane on database 0 never
consumes a test's tasks or channel messages.
"""

from __future__ import annotations

import os

os.environ["REDIS_URL"] = os.environ.get("TEST_REDIS_URL") or "redis://127.0.0.1:6379/15"

from cleverthis.settings.base import *  # noqa: F403
from cleverthis.settings.base import CACHES, CHANNEL_LAYERS

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = "cleverthis-test:channels:"
CACHES["default"]["KEY_PREFIX"] = "cleverthis-test"

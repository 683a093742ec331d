"""Request limits: agent registration and sign-in answer 429 with Retry-After past the configured rate."""

from __future__ import annotations

import pytest
import redis
from django.conf import settings
from django.core.cache import cache
from rest_framework.test import APIClient

from cleverthis.settings.env import env_rate
from kernel.rates import parse_rate

pytestmark = pytest.mark.django_db

REGISTER = "/api/v1/agent/register"
# Day-long windows: a test's requests never straddle two windows.
LOW = "2/day"


@pytest.fixture(autouse=True)
def no_counters_left():
    """Each test starts without counters and leaves none behind in Redis."""
    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    pattern = cache.make_key("throttle:*")

    def clear() -> None:
        for key in client.scan_iter(match=pattern):
            client.delete(key)

    clear()
    yield
    clear()
    assert list(client.scan_iter(match=pattern)) == []
    client.close()


def _retry_after(response) -> int:
    value = int(response["Retry-After"])
    assert 1 <= value <= 86400
    return value


def test_agent_registration_is_limited_per_client_ip(settings):
    settings.AGENT_REGISTER_RATE = LOW
    client = APIClient()
    for _ in range(2):
        assert client.post(REGISTER, {}, format="json").status_code == 400  # counted, then validated
    throttled = client.post(REGISTER, {}, format="json")
    assert throttled.status_code == 429
    seconds = _retry_after(throttled)
    assert f"Expected available in {seconds} second" in throttled.json()["detail"]
    assert client.post(REGISTER, {}, format="json", REMOTE_ADDR="10.0.0.7").status_code == 400  # another client
    # A forged X-Forwarded-For does not make a new client.
    assert client.post(REGISTER, {}, format="json", HTTP_X_FORWARDED_FOR="10.9.9.9").status_code == 429
    settings.AGENT_REGISTER_RATE = "100/day"  # read on every request: a raised limit applies at once
    assert client.post(REGISTER, {}, format="json").status_code == 400


def test_registration_goes_on_when_the_cache_is_unreachable(settings):
    settings.AGENT_REGISTER_RATE = "1/day"
    client = APIClient()
    assert client.post(REGISTER, {}, format="json").status_code == 400
    assert client.post(REGISTER, {}, format="json").status_code == 429
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"}
    }
    assert client.post(REGISTER, {}, format="json").status_code == 400  # not a 500, not a lock-out


def test_sign_in_is_limited_per_client_ip_and_per_username(client, make_user, settings):
    settings.SIGN_IN_RATE = LOW
    make_user("alice")
    make_user("bob")
    for _ in range(2):
        assert client.post("/accounts/login/", {"username": "alice", "password": "wrong"}).status_code == 200
    page = client.post("/accounts/login/", {"username": "alice", "password": "pw-alice"})
    assert page.status_code == 429
    _retry_after(page)
    assert b"Too many sign-in attempts" in page.content
    assert "_auth_user_id" not in client.session  # the right password did not sign in past the limit
    # Same username from another address: the per-username counter holds (case does not help).
    elsewhere = client.post("/accounts/login/", {"username": "ALICE", "password": "pw-alice"}, REMOTE_ADDR="10.0.0.8")
    assert elsewhere.status_code == 429
    # Another username from another address signs in.
    other = client.post("/accounts/login/", {"username": "bob", "password": "pw-bob"}, REMOTE_ADDR="10.0.0.9")
    assert other.status_code == 302
    # Pages are not sign-in attempts.
    assert client.get("/accounts/login/", REMOTE_ADDR="10.0.0.8").status_code == 200


def test_admin_sign_in_shares_the_limit(client, make_user, settings):
    settings.SIGN_IN_RATE = LOW
    make_user("root", is_staff=True, is_superuser=True)
    for _ in range(2):
        assert client.post("/accounts/login/", {"username": "root", "password": "wrong"}).status_code == 200
    admin = client.post("/admin/login/", {"username": "root", "password": "pw-root"}, REMOTE_ADDR="10.0.0.5")
    assert admin.status_code == 429
    _retry_after(admin)
    assert "_auth_user_id" not in client.session


def test_rates_parse_and_a_bad_one_fails_at_start_up(monkeypatch):
    assert parse_rate("30/min") == (30, 60)
    assert parse_rate("10/s") == (10, 1)
    assert parse_rate("100/hour") == (100, 3600)
    assert parse_rate("5/10min") == (5, 600)
    assert parse_rate("1000/days") == (1000, 86400)
    assert env_rate("X_RATE_UNSET", "30/min") == "30/min"
    monkeypatch.setenv("X_RATE", "lots")
    with pytest.raises(ValueError, match="X_RATE"):
        env_rate("X_RATE", "30/min")

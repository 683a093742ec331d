"""Settings come from the environment, with PostgreSQL and Redis only."""

from __future__ import annotations

import pytest
from django.conf import settings

from cleverthis.settings.env import database_from_url, env_bool, env_int, env_list


def test_database_is_postgresql_never_sqlite():
    assert settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"


def test_redis_backs_channels_celery_and_cache():
    assert settings.CHANNEL_LAYERS["default"]["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    assert settings.CELERY_BROKER_URL.startswith("redis://")
    assert settings.CELERY_TASK_SERIALIZER == "json"
    assert settings.CELERY_ACCEPT_CONTENT == ["json"]


def test_database_url_is_parsed():
    db = database_from_url("postgres://fleet:s%40cret@db.internal:6543/fleetdb")
    assert (db["USER"], db["PASSWORD"], db["HOST"], db["PORT"], db["NAME"]) == (
        "fleet",
        "s@cret",
        "db.internal",
        "6543",
        "fleetdb",
    )


def test_non_postgres_database_url_is_refused():
    with pytest.raises(ValueError, match="PostgreSQL"):
        database_from_url("sqlite:///db.sqlite3")


def test_typed_env_readers(monkeypatch):
    monkeypatch.setenv("X_INT", "42")
    monkeypatch.setenv("X_BOOL", "no")
    monkeypatch.setenv("X_LIST", "a, b,,c")
    assert env_int("X_INT", 1) == 42
    assert env_bool("X_BOOL", True) is False
    assert env_list("X_LIST", []) == ["a", "b", "c"]
    assert env_int("X_UNSET", 7) == 7
    monkeypatch.setenv("X_INT", "forty")
    with pytest.raises(ValueError, match="X_INT"):
        env_int("X_INT", 1)


def test_settings_module_loads_in_a_fresh_interpreter_from_env(tmp_path):
    import subprocess
    import sys

    code = (
        "import django, os; os.environ['DJANGO_SETTINGS_MODULE']='cleverthis.settings.base'; django.setup();"
        "from django.conf import settings as s; print(s.DATABASES['default']['NAME'], s.REDIS_URL, s.DEBUG)"
    )
    env = {
        "DATABASE_URL": "postgres://u@h:5433/otherdb",
        "REDIS_URL": "redis://r:6380/2",
        "DEBUG": "0",
        "PATH": "/usr/bin:/bin",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),  # never the checkout's var/
    }
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["otherdb", "redis://r:6380/2", "False"]


@pytest.mark.django_db
@pytest.mark.parametrize("body", ["[" * 100_000, "[" * 900 + "]" * 900, '{"a":' * 70 + "1" + "}" * 70])
def test_api_bodies_nested_too_deeply_are_a_400_not_a_500(owner, api_client_for, body):
    response = api_client_for(owner).generic("POST", "/api/v1/clusters/", body, content_type="application/json")
    assert response.status_code == 400
    assert "nested deeper than" in response.json()["detail"]


def test_https_cookies_take_the_host_prefix_a_subdomain_cannot_set(tmp_path):
    import subprocess
    import sys

    code = (
        "from django.conf import settings; import django; django.setup(); "
        "print(settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME, settings.SESSION_COOKIE_SECURE)"
    )
    env = {
        "DJANGO_SETTINGS_MODULE": "cleverthis.settings.base",
        "HTTPS_COOKIES": "1",
        "PATH": "/usr/bin:/bin",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),  # never the checkout's var/
    }
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["__Host-sessionid", "__Host-csrftoken", "True"]

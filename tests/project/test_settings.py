"""Settings come from the environment, with PostgreSQL and Redis only."""

from __future__ import annotations

import secrets
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from cleverthis.settings.env import database_from_url, env_bool, env_int, env_list
from tests.support.processes import REPO_ROOT


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
        "SECRET_KEY": settings.SECRET_KEY,  # DEBUG off: a key production would accept
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
        "SECRET_KEY": settings.SECRET_KEY,  # DEBUG off: a key production would accept
        "HTTPS_COOKIES": "1",
        "PATH": "/usr/bin:/bin",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),  # never the checkout's var/
    }
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["__Host-sessionid", "__Host-csrftoken", "True"]


def _settings_in_a_fresh_interpreter(tmp_path, code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django.conf import settings; " + code],
        env={
            "DJANGO_SETTINGS_MODULE": "cleverthis.settings.base",
            "SECRET_KEY": settings.SECRET_KEY,  # DEBUG off: a key production would accept
            "PATH": "/usr/bin:/bin",
            "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),  # never the checkout's var/
            **env,
        },
        capture_output=True,
        text=True,
        check=True,
    )


def test_allowed_hosts_follow_the_control_plane_and_the_origin_domains(tmp_path):
    """Finding: ALLOWED_HOSTS defaulted to `*`, so any Host (a malformed node host too) got the control plane."""
    code = "print(' '.join(settings.ALLOWED_HOSTS))"
    configured = _settings_in_a_fresh_interpreter(
        tmp_path,
        code,
        CONTROL_PLANE_URL="https://Fleet.Example.com:8443/",
        ENDPOINT_DOMAIN="endpoints.example-usercontent.com",
        RAY_DASHBOARD_DOMAIN=".ray.example-dashboards.com",
    )
    assert configured.stdout.split() == [
        "fleet.example.com",
        ".endpoints.example-usercontent.com",
        ".ray.example-dashboards.com",
        "localhost",
        "127.0.0.1",
        "[::1]",
    ]
    default = _settings_in_a_fresh_interpreter(tmp_path, code)
    assert default.stdout.split() == ["127.0.0.1", ".endpoints.localhost", ".ray.localhost", "localhost", "[::1]"]
    explicit = _settings_in_a_fresh_interpreter(tmp_path, code, ALLOWED_HOSTS="a.example,*")
    assert explicit.stdout.split() == ["a.example", "*"]


def test_start_up_warns_when_node_origins_share_a_site_with_the_control_plane_or_each_other(tmp_path):
    """Finding: sibling node origins under one parent domain are one *site*: SameSite cookies do not
    separate them, nor them from the control plane. Process start-up (`ready()`) says so, loudly."""
    shared = _settings_in_a_fresh_interpreter(
        tmp_path,
        "pass",
        CONTROL_PLANE_URL="https://fleet.example.com",
        ENDPOINT_DOMAIN="endpoints.example.com",
        RAY_DASHBOARD_DOMAIN="ray.example.com",
    )
    assert "ENDPOINT_DOMAIN" in shared.stderr
    assert "RAY_DASHBOARD_DOMAIN" in shared.stderr
    assert "example.com" in shared.stderr
    apart = _settings_in_a_fresh_interpreter(
        tmp_path,
        "pass",
        CONTROL_PLANE_URL="https://fleet.example.com",
        ENDPOINT_DOMAIN="endpoints.example-usercontent.com",
        RAY_DASHBOARD_DOMAIN="example-dashboards.net",
    )
    assert "DOMAIN" not in apart.stderr
    development = _settings_in_a_fresh_interpreter(tmp_path, "pass", CONTROL_PLANE_URL="http://localhost:8000")
    assert "DOMAIN" not in development.stderr  # *.localhost in development


@pytest.mark.parametrize(
    ("control_plane", "endpoints", "dashboards", "named"),
    [
        ("https://fleet.example.com", "endpoints.example.com", "example-ray.net", ["ENDPOINT_DOMAIN"]),
        ("https://fleet.example.com", "apps.net", "ray.apps.net", ["ENDPOINT_DOMAIN", "RAY_DASHBOARD_DOMAIN"]),
        ("https://example.com", "example-apps.net", "dash.example.com", ["RAY_DASHBOARD_DOMAIN"]),
        ("https://fleet.example.com", "example-apps.net", "example-ray.net", []),
        ("http://127.0.0.1:8000", "endpoints.localhost", "ray.localhost", []),
    ],
)
def test_the_system_check_names_the_domains_that_share_a_site(settings, control_plane, endpoints, dashboards, named):
    from django.core import checks

    settings.CONTROL_PLANE_URL, settings.ENDPOINT_DOMAIN, settings.RAY_DASHBOARD_DOMAIN = (
        control_plane,
        endpoints,
        dashboards,
    )
    found = [m for m in checks.run_checks(tags=[checks.Tags.security]) if m.id.startswith("fleet.proxy.")]
    assert all(m.level == checks.WARNING for m in found)
    assert sorted({name for m in found for name in named if name in m.msg}) == sorted(named)
    assert bool(found) == bool(named)


REPO = Path(__file__).resolve().parents[2]


def _server_url(name: str) -> str:
    db = settings.DATABASES["default"]
    return f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{name}"


def _run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "m"),
        "DEBUG": "1",  # the development key is accepted: these runs are about the database
    }
    return subprocess.run(args, cwd=REPO, env={**base, **env}, capture_output=True, text=True, timeout=120)


def test_one_setting_names_the_database_everywhere(tmp_path):
    """CLEVERTHIS_DB_NAME alone moves the application too (it used to move only .ci/setup); DATABASE_URL
    wins; the two naming different databases is refused with a sentence, by the settings and the scripts."""
    code = "import django; django.setup(); from django.conf import settings as s; print(s.DATABASES['default']['NAME'])"
    settings_env = {"DJANGO_SETTINGS_MODULE": "cleverthis.settings.base"}
    alone = _run([sys.executable, "-c", code], tmp_path, **settings_env, CLEVERTHIS_DB_NAME="fleet_a")
    assert alone.stdout.split() == ["fleet_a"], alone.stderr
    rule = [sys.executable, "cleverthis/settings/database.py", "name"]
    assert _run(rule, tmp_path, CLEVERTHIS_DB_NAME="fleet_a").stdout.split() == ["fleet_a"]
    both = {"CLEVERTHIS_DB_NAME": "fleet_a", "DATABASE_URL": "postgres://u@h:5433/fleet_a"}
    assert _run([sys.executable, "-c", code], tmp_path, **settings_env, **both).stdout.split() == ["fleet_a"]
    clash = {"CLEVERTHIS_DB_NAME": "fleet_a", "DATABASE_URL": "postgres://u@h:5433/fleet_b"}
    sentence = "DATABASE_URL names the database 'fleet_b' but CLEVERTHIS_DB_NAME names 'fleet_a'"
    for args in ([sys.executable, "manage.py", "check"], rule, ["bash", ".ci/database"]):
        refused = _run(args, tmp_path, **clash)
        assert refused.returncode != 0, args
        assert sentence in refused.stderr, (args, refused.stderr)
        assert "Traceback" not in refused.stderr


@pytest.mark.django_db
def test_a_missing_database_is_created_by_the_scripts_or_refused_in_a_sentence(tmp_path):
    name = f"cleverthis_probe_{uuid.uuid4().hex[:10]}"
    url = _server_url(name)
    refused = _run([sys.executable, "manage.py", "migrate", "--noinput"], tmp_path, DATABASE_URL=url)
    assert refused.returncode != 0
    assert f"the database '{name}' that DATABASE_URL names does not exist" in refused.stderr
    assert "Traceback" not in refused.stderr
    try:
        created = _run(["bash", ".ci/database"], tmp_path, DATABASE_URL=url)  # what .ci/setup and .ci/up run
        assert created.returncode == 0, created.stderr
        assert f"creating database {name}" in created.stdout
        assert _run(["bash", ".ci/database"], tmp_path, DATABASE_URL=url).stdout == ""  # there now: left alone
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_database WHERE datname = %s", [name])
            assert cursor.fetchone() == (1,)
    finally:
        _run(["psql", _server_url("postgres"), "-qc", f'DROP DATABASE IF EXISTS "{name}"'], tmp_path)


def _start_settings(tmp_path, **env: str) -> subprocess.CompletedProcess:
    """Load the production settings in a fresh interpreter with only `env` (and no key unless given)."""
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django.conf import settings as s; print(s.DEBUG)"],
        env={
            "DJANGO_SETTINGS_MODULE": "cleverthis.settings.base",
            "PATH": "/usr/bin:/bin",
            "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),
            **env,
        },
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize(
    ("key", "why"),
    [
        (None, "published example or default"),  # the development default
        ("change-me", "published example or default"),  # secret.example.yaml
        ("build", "published example or default"),
        ("a-short-but-random-looking-key-9f8e7d", "37 characters long"),
        ("ab" * 40, "2 distinct characters"),
        ("django-insecure-" + "x1y2z3w4v5" * 5, "Django's insecure"),
        ("please-change-me-" + "0123456789abcdef" * 3, "published example or default"),
    ],
)
def test_production_refuses_to_start_on_a_public_or_weak_secret_key(tmp_path, key, why):
    env = {} if key is None else {"SECRET_KEY": key}
    started = _start_settings(tmp_path, **env)  # DEBUG unset: off
    assert started.returncode != 0
    assert "Refusing to start with DEBUG off: SECRET_KEY" in started.stderr
    assert why in started.stderr
    assert "token_urlsafe(50)" in started.stderr  # how to make a good one


def test_debug_is_off_unless_asked_for_and_a_strong_key_starts(tmp_path):
    strong = _start_settings(tmp_path, SECRET_KEY="Zq4" + "k7Hw-p2Xe_9rTb" * 4)
    assert strong.returncode == 0, strong.stderr
    assert strong.stdout.split() == ["False"]
    # development asks for DEBUG and may keep the public default
    development = _start_settings(tmp_path, DEBUG="1")
    assert development.returncode == 0, development.stderr
    assert development.stdout.split() == ["True"]


def test_the_deployments_make_keys_production_accepts():
    """deploy/compose/init writes `openssl rand -hex 32` (64 characters); the Kubernetes template's placeholder
    is refused, so a copy applied unchanged never starts."""
    from cleverthis.settings.env import secret_key_problem

    assert secret_key_problem("0123456789abcdef" * 4) is None
    assert secret_key_problem(secrets.token_hex(32)) is None
    assert secret_key_problem(secrets.token_urlsafe(50)) is None
    template = (REPO_ROOT / "deploy" / "kubernetes" / "secret.example.yaml").read_text()
    placeholder = next(line.split(":", 1)[1].strip() for line in template.splitlines() if "SECRET_KEY:" in line)
    assert secret_key_problem(placeholder) is not None
    assert "SECRET_KEY=$(secret 32)" in (REPO_ROOT / "deploy" / "compose" / "init").read_text()


def test_hsts_is_on_for_a_year_when_the_deployment_says_it_is_behind_https(tmp_path):
    code = "print(settings.SECURE_HSTS_SECONDS, settings.SECURE_HSTS_INCLUDE_SUBDOMAINS, settings.SECURE_HSTS_PRELOAD)"
    behind_tls = _settings_in_a_fresh_interpreter(tmp_path, code, HTTPS_COOKIES="1")
    assert behind_tls.stdout.split() == ["31536000", "False", "False"]
    plain = _settings_in_a_fresh_interpreter(tmp_path, code)
    assert plain.stdout.split()[0] == "0"
    chosen = _settings_in_a_fresh_interpreter(tmp_path, code, HTTPS_COOKIES="1", HSTS_SECONDS="600")
    assert chosen.stdout.split()[0] == "600"

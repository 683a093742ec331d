"""Typed readers for settings that come from environment variables."""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import unquote, urlparse

from kernel.rates import parse_rate


def env_str(name: str, default: str) -> str:
    """Return the variable `name`, or `default` when unset or empty."""
    return os.environ.get(name) or default


def env_int(name: str, default: int) -> int:
    """Return the variable `name` as an int; a malformed value fails loudly at start-up."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from exc


def env_float(name: str, default: float) -> float:
    """Return the variable `name` as a float; a malformed value fails loudly at start-up."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {name} must be a number, got {raw!r}") from exc


def env_bool(name: str, default: bool) -> bool:
    """Return the variable `name` read as a boolean (1/true/yes/on)."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: list[str]) -> list[str]:
    """Return the comma-separated variable `name` as a list of non-empty items."""
    raw = os.environ.get(name)
    if not raw:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_map(name: str, default: dict[str, str]) -> dict[str, str]:
    """Return the comma-separated `key=value` items of variable `name` as a dict; an item without `=` fails
    loudly at start-up."""
    items = env_list(name, [])
    if not items:
        return dict(default)
    malformed = [item for item in items if "=" not in item]
    if malformed:
        raise ValueError(f"environment variable {name} holds key=value items, got {', '.join(malformed)!r}")
    return {key.strip(): value.strip() for key, _, value in (item.partition("=") for item in items)}


def env_rate(name: str, default: str) -> str:
    """Return the variable `name` as a request rate like `30/min`; a malformed one fails loudly at start-up."""
    raw = env_str(name, default)
    try:
        parse_rate(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {name}: {exc}") from None
    return raw


def database_from_url(url: str, *, pool_max_size: int = 0) -> dict[str, Any]:
    """Turn `postgres://user:pass@host:port/name` into a Django DATABASES entry.

    `pool_max_size` > 0 gives the process a psycopg connection pool of that size instead of one new
    connection per request or per thread-pool call (`CONN_MAX_AGE` stays 0, as Django requires).
    """
    parsed = urlparse(url)
    if parsed.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise ValueError(f"DATABASE_URL must be a PostgreSQL URL, got scheme {parsed.scheme!r}")
    database: dict[str, Any] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parsed.path.lstrip("/")) or "cleverthis",
        "USER": unquote(parsed.username or "") or "postgres",
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": parsed.hostname or "127.0.0.1",
        "PORT": str(parsed.port or 5432),
        "CONN_MAX_AGE": 0,
        "TEST": {"NAME": f"test_{unquote(parsed.path.lstrip('/')) or 'cleverthis'}"},
    }
    if pool_max_size > 0:
        database["OPTIONS"] = {"pool": {"min_size": 1, "max_size": pool_max_size, "timeout": 30}}
    return database


WORKSPACE_ROLES = ("owner", "admin", "member", "viewer")


def env_workspace_map(name: str) -> tuple[tuple[str, str, str], ...]:
    """Return the claim mapping `name` as (claim value, workspace slug, role) triples.

    Format: comma-separated `<claim value>=<workspace slug>:<role>`, e.g.
    `fleet-admins=acme:admin,fleet-users=acme:member`; a value may map to several workspaces. A malformed
    entry, a bad slug or an unknown role fails loudly at start-up.
    """
    entries = []
    for item in env_list(name, []):
        value, eq, place = item.rpartition("=")
        slug, colon, role = place.partition(":")
        value, slug, role = value.strip(), slug.strip(), role.strip().lower()
        if not eq or not value or not colon:
            raise ValueError(f"environment variable {name}: {item!r} is not `<claim value>=<workspace slug>:<role>`")
        if not re.fullmatch(r"[-a-zA-Z0-9_]+", slug):
            raise ValueError(f"environment variable {name}: {slug!r} in {item!r} is not a workspace slug")
        if role not in WORKSPACE_ROLES:
            raise ValueError(
                f"environment variable {name}: role {role!r} in {item!r} is not one of {', '.join(WORKSPACE_ROLES)}"
            )
        entries.append((value, slug, role))
    return tuple(entries)


def _is_url(value: str) -> bool:
    parts = urlparse(value)
    return parts.scheme in {"http", "https"} and bool(parts.netloc)


def oidc_config_errors(
    *,
    client_secret: str,
    discovery_url: str,
    endpoints: dict[str, str],
    sign_algo: str,
) -> list[str]:
    """What is missing or malformed in an enabled OIDC configuration (empty: it is complete).

    Either a discovery document (OIDC_ISSUER or OIDC_DISCOVERY_URL) or the explicit endpoints
    (OIDC_AUTHORIZATION_ENDPOINT, OIDC_TOKEN_ENDPOINT, OIDC_USERINFO_ENDPOINT, and OIDC_JWKS_ENDPOINT for
    RS*/ES* signatures) must be given; explicit endpoints override discovered ones.
    """
    errors = []
    if not client_secret:
        errors.append("OIDC_CLIENT_SECRET is required with OIDC_CLIENT_ID")
    if discovery_url and not _is_url(discovery_url):
        errors.append(f"OIDC_ISSUER / OIDC_DISCOVERY_URL must be an http(s) URL, got {discovery_url!r}")
    for variable, value in endpoints.items():
        if value and not _is_url(value):
            errors.append(f"{variable} must be an http(s) URL, got {value!r}")
    if not discovery_url:
        required = ["OIDC_AUTHORIZATION_ENDPOINT", "OIDC_TOKEN_ENDPOINT", "OIDC_USERINFO_ENDPOINT"]
        if sign_algo.startswith(("RS", "ES")):
            required.append("OIDC_JWKS_ENDPOINT")
        missing = [variable for variable in required if not endpoints.get(variable)]
        if missing:
            errors.append(f"without OIDC_ISSUER or OIDC_DISCOVERY_URL these are required: {', '.join(missing)}")
    if sign_algo not in {"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "HS256"}:
        errors.append(f"OIDC_SIGN_ALGO {sign_algo!r} is not a supported JWS algorithm")
    return errors


# The development default of SECRET_KEY (settings.base): public, so refused whenever DEBUG is off.
DEV_SECRET_KEY = "dev-insecure-secret-key-change-me-in-production-0123456789"
# Values published as examples (secret.example.yaml, docs) or used in builds.
_PUBLIC_SECRET_KEYS = frozenset({DEV_SECRET_KEY, "change-me", "changeme", "build", "secret"})
SECRET_KEY_MIN_LENGTH = 50
SECRET_KEY_MIN_UNIQUE_CHARACTERS = 5


def secret_key_problem(key: str) -> str | None:
    """Why `key` must not sign production's sessions, cookies and peer links, or None when it may.

    Refused: a published value (the development default, `change-me` and other example placeholders),
    Django's own insecure prefix, and anything Django's deployment check calls weak (shorter than 50
    characters or fewer than 5 distinct ones).
    """
    lowered = key.strip().lower()
    if key in _PUBLIC_SECRET_KEYS or "change-me" in lowered or "changeme" in lowered:
        return "is a published example or default value"
    if key.startswith("django-insecure-"):
        return "is one of Django's insecure development keys"
    if len(key) < SECRET_KEY_MIN_LENGTH:
        return f"is {len(key)} characters long (at least {SECRET_KEY_MIN_LENGTH} are needed)"
    if len(set(key)) < SECRET_KEY_MIN_UNIQUE_CHARACTERS:
        return f"has {len(set(key))} distinct characters (at least {SECRET_KEY_MIN_UNIQUE_CHARACTERS} are needed)"
    return None


def refuse_weak_secret_key(key: str, *, debug: bool) -> None:
    """Stop the process (ImproperlyConfigured) when DEBUG is off and `key` is weak or public."""
    from django.core.exceptions import ImproperlyConfigured

    problem = None if debug else secret_key_problem(key)
    if problem:
        raise ImproperlyConfigured(
            f"Refusing to start with DEBUG off: SECRET_KEY {problem}, and anyone who knows or guesses it can "
            "forge sessions, node-origin cookies and peer-link handshakes. Set SECRET_KEY to a random value "
            "of at least 50 characters (python -c 'import secrets; print(secrets.token_urlsafe(50))'), or "
            "DEBUG=1 on a development machine."
        )

"""Typed readers for settings that come from environment variables."""

from __future__ import annotations

import os
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

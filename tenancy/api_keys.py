"""API keys: their format and hash, and who a presented key stands for (cached per process, briefly).

A key reads `ctk_<prefix>_<secret>`; only the SHA-256 of the whole text is stored (as join tokens are).
`grant_for(raw)` answers what a key may do now: the key's scopes, its workspace and its owner's current
role there, or None for an unknown, revoked or expired key, an inactive owner, or one no longer a member.
Answers are kept in process memory for API_KEY_CACHE_S (default 0.5 s), so a stream of requests costs no
query each, and a revocation or a lowered role made on any replica is in force everywhere within that
time (this process forgets at once what it revokes itself). The proxy re-reads the keys its requests use
before their answers go stale (`reload_grants`, from `fleet.proxy.warm_caches`), so a key used now and then
still costs its requests no query.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from tenancy.models import ApiKey, ApiKeyScope, Membership

KEY_MARK = "ctk_"
LAST_USED_EVERY_S = 60.0
_CACHE_MAX = 10_000


def hash_key(raw: str) -> str:
    """The stored form of a key: hex SHA-256 of the whole text."""
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def new_key() -> tuple[str, str]:
    """A fresh (raw key, public prefix)."""
    prefix = secrets.token_hex(4)
    return f"{KEY_MARK}{prefix}_{secrets.token_urlsafe(32)}", prefix


def key_from_authorization(value: str) -> str | None:
    """The API key an `Authorization: Bearer <key>` (or `Token <key>`) header carries, else None."""
    scheme, _, key = value.partition(" ")
    key = key.strip()
    if scheme.lower() in ("bearer", "token") and key.startswith(KEY_MARK):
        return key
    return None


@dataclass(frozen=True)
class KeyGrant:
    """What one key may do, as read at `loaded_at` (monotonic seconds)."""

    key_id: int
    user_id: int
    workspace_id: UUID
    scopes: frozenset[str]
    role: str
    requests_per_min: int | None
    tokens_per_min: int | None
    expires_at: float | None  # epoch seconds
    loaded_at: float

    def allows(self, scope: str) -> bool:
        """Whether the key holds `scope` (operate implies read) and has not expired."""
        if self.expires_at is not None and time.time() >= self.expires_at:
            return False
        return scope in self.scopes or (scope == ApiKeyScope.READ and ApiKeyScope.OPERATE in self.scopes)


def load_grant(raw: str) -> KeyGrant | None:
    """Read what `raw` may do from the database (one query); None if it may do nothing."""
    return load_grants([raw])[raw]


def load_grants(raws: list[str]) -> dict[str, KeyGrant | None]:
    """Read what each of `raws` may do (one query): {raw: its grant, or None if it may do nothing}."""
    started = time.monotonic()
    by_hash = {hash_key(raw): raw for raw in raws}
    role = Membership.objects.filter(user_id=OuterRef("user_id"), workspace_id=OuterRef("workspace_id")).values("role")
    rows = (
        ApiKey.objects.filter(secret_hash__in=list(by_hash), revoked_at__isnull=True, user__is_active=True)
        .annotate(role=Subquery(role[:1]))
        .values(
            "secret_hash", "id", "user_id", "workspace_id", "scopes", "role", "requests_per_min", "tokens_per_min",
            "expires_at",
        )
    )  # fmt: skip
    found: dict[str, KeyGrant | None] = dict.fromkeys(raws)
    now = timezone.now()
    for row in rows:
        expires: datetime | None = row["expires_at"]
        if row["role"] is None or (expires is not None and expires <= now):
            continue
        found[by_hash[row["secret_hash"]]] = KeyGrant(
            key_id=row["id"],
            user_id=row["user_id"],
            workspace_id=row["workspace_id"],
            scopes=frozenset(row["scopes"] or ()),
            role=row["role"],
            requests_per_min=row["requests_per_min"],
            tokens_per_min=row["tokens_per_min"],
            expires_at=expires.timestamp() if expires is not None else None,
            loaded_at=started,
        )
    return found


class _Missing:
    pass


MISSING: Any = _Missing()
_grants: dict[str, tuple[KeyGrant | None, float]] = {}  # raw key → (grant or None, loaded_at)


def cached_grant(raw: str) -> KeyGrant | _Missing | None:
    """The cached answer for `raw` if younger than API_KEY_CACHE_S, else MISSING (no database)."""
    found = _grants.get(raw)
    if found is None or time.monotonic() - found[1] >= settings.API_KEY_CACHE_S:
        return MISSING
    return found[0]


def grant_for(raw: str) -> KeyGrant | None:
    """What `raw` may do now: from the cache, else from the database (sync)."""
    found = cached_grant(raw)
    if found is not MISSING:
        return found
    started = time.monotonic()
    grant = load_grant(raw)
    if settings.API_KEY_CACHE_S > 0:
        if len(_grants) >= _CACHE_MAX:
            _grants.clear()
        _grants[raw] = (grant, started)
    return grant


def grant_age(raw: str) -> float | None:
    """How old the cached answer for `raw` is (seconds), None when none is cached."""
    found = _grants.get(raw)
    return None if found is None else time.monotonic() - found[1]


def reload_grants(raws: list[str]) -> None:
    """Re-read the cached answers for `raws` in one query (sync; `fleet.proxy.warm_caches` calls it before
    they go stale). Each counts its age from before the read, so none is ever trusted longer than
    API_KEY_CACHE_S after the database said it; answers forgotten meanwhile stay forgotten."""
    started = time.monotonic()
    grants = load_grants(raws)
    for raw in raws:
        if raw in _grants:
            _grants[raw] = (grants[raw], started)


def forget_grants() -> None:
    """Drop every cached answer (a key was revoked or changed in this process)."""
    _grants.clear()


_last_written: dict[int, float] = {}


def last_use_due(key_id: int) -> bool:
    """Whether this process should record a use of `key_id` now (at most once a minute per key)."""
    now = time.monotonic()
    if now - _last_written.get(key_id, -1e9) < LAST_USED_EVERY_S:
        return False
    if len(_last_written) >= _CACHE_MAX:
        _last_written.clear()
    _last_written[key_id] = now
    return True


def record_last_use(key_id: int, ip: str | None) -> None:
    """Write when and from where `key_id` was last used (callers ask `last_use_due` first)."""
    ApiKey.objects.filter(pk=key_id).update(last_used_at=timezone.now(), last_used_ip=ip or None)

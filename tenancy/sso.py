"""Single sign-on claims, read without side effects: which workspaces (and roles) a user's claims map to,
and the username a new user gets."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from tenancy.models import Role

# Most powerful first: when several claim values map to one workspace, the strongest role wins.
ROLE_ORDER = (Role.OWNER, Role.ADMIN, Role.MEMBER, Role.VIEWER)
USERNAME_MAX = 150


def claim_values(claims: Mapping[str, Any], claim: str) -> list[str]:
    """The values of `claim` as a list of strings: a list claim as it is, a string as one value (a space- or
    comma-separated string as several), a missing claim as none."""
    raw = claims.get(claim)
    if raw is None:
        return []
    if isinstance(raw, str):
        return [part for part in re.split(r"[\s,]+", raw) if part]
    if isinstance(raw, Iterable):
        return [str(value) for value in raw if value is not None and str(value)]
    return [str(raw)]


def workspace_grants(values: Iterable[str], mapping: Iterable[tuple[str, str, str]]) -> dict[str, Role]:
    """The role per workspace slug that the claim `values` are granted by `mapping` ((value, slug, role)
    triples, OIDC_WORKSPACE_MAP); the strongest role when several values map to one workspace."""
    have = set(values)
    grants: dict[str, Role] = {}
    for value, slug, role in mapping:
        if value not in have:
            continue
        granted = Role(role)
        current = grants.get(slug)
        if current is None or ROLE_ORDER.index(granted) < ROLE_ORDER.index(current):
            grants[slug] = granted
    return grants


def username_base(claims: Mapping[str, Any], username_claim: str) -> str:
    """The username a new user asks for: the username claim, else the e-mail's local part, else the
    subject; characters Django's usernames refuse become `-`."""
    email = str(claims.get("email") or "")
    wanted = str(claims.get(username_claim) or "") or email.partition("@")[0] or str(claims.get("sub") or "")
    return re.sub(r"[^\w.@+-]", "-", wanted)[: USERNAME_MAX - 8] or "sso-user"

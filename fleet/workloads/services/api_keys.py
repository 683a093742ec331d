"""Writes for API keys: a member creates keys for themselves, and revokes their own (audited).

The key row lives in `tenancy` (authentication reads it); the endpoints a key is limited to
live here, beside the endpoints (`ApiKeyEndpoint`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.utils import timezone

from audit.services import created, new, on, operator_action
from fleet.workloads.models import ApiKeyEndpoint, Endpoint
from fleet.workloads.services.endpoints.limits import validate_per_minute
from kernel.exceptions import IllegalTransition
from tenancy import api_keys
from tenancy.models import ApiKey, ApiKeyScope, Workspace
from tenancy.permissions import can_view

MAX_KEYS_PER_MEMBER = 100


@operator_action(
    "api_key.create",
    target=new("api_key", name="name", within="workspace"),
    result=created("api_key", pick=lambda value: value[0]),
    detail=lambda kw, _: {"scopes": sorted(str(s) for s in kw.get("scopes") or ())},
)
def api_key_create(
    *,
    actor: AbstractBaseUser,
    workspace: Workspace,
    name: str,
    scopes: Iterable[str],
    endpoints: Iterable[Endpoint] = (),
    expires_at: datetime | None = None,
    requests_per_min: int | None = None,
    tokens_per_min: int | None = None,
) -> tuple[ApiKey, str]:
    """Create a key for `actor` in `workspace`; returns (row, the secret, shown only now). Any member."""
    if not can_view(actor, workspace):
        raise PermissionDenied("Only members of this workspace can create keys for it.")
    scopes = sorted(set(scopes))
    errors: dict[str, str] = {}
    if not name.strip():
        errors["name"] = "Give the key a name."
    if not scopes or any(s not in ApiKeyScope.values for s in scopes):
        errors["scopes"] = f"Choose one or more of: {', '.join(ApiKeyScope.values)}."
    if expires_at is not None and expires_at <= timezone.now():
        errors["expires_at"] = "The expiry must be in the future."
    endpoints = list(endpoints)
    if any(e.cluster.workspace_id != workspace.pk for e in endpoints):
        errors["endpoints"] = "Every endpoint must belong to the key's workspace."
    for field, value in (("requests_per_min", requests_per_min), ("tokens_per_min", tokens_per_min)):
        try:
            validate_per_minute(field, value)
        except ValidationError as exc:
            errors |= {name: messages[0] for name, messages in exc.message_dict.items()}
    if ApiKey.objects.filter(user=actor, revoked_at__isnull=True).count() >= MAX_KEYS_PER_MEMBER:
        errors["name"] = f"You have {MAX_KEYS_PER_MEMBER} keys; revoke one first."
    if errors:
        raise ValidationError(errors)
    raw, prefix = api_keys.new_key()
    key = ApiKey.objects.create(
        user=actor,
        workspace=workspace,
        name=name.strip()[:100],
        prefix=prefix,
        secret_hash=api_keys.hash_key(raw),
        scopes=scopes,
        expires_at=expires_at,
        requests_per_min=requests_per_min,
        tokens_per_min=tokens_per_min,
    )
    ApiKeyEndpoint.objects.bulk_create(ApiKeyEndpoint(key=key, endpoint=e) for e in endpoints)
    return key, raw


@operator_action("api_key.revoke", target=on("key", "api_key"))
def api_key_revoke(*, actor: AbstractBaseUser, key: ApiKey) -> ApiKey:
    """Revoke `key` (its owner only); every replica refuses it within API_KEY_CACHE_S. 409 if revoked."""
    if key.user_id != actor.pk:
        raise PermissionDenied("Only the key's owner can revoke it.")
    if ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now()) == 0:
        raise IllegalTransition("This key is already revoked.")
    api_keys.forget_grants()
    key.refresh_from_db()
    return key

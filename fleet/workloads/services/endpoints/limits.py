"""Writes for an endpoint's per-key rate limits: the requests and tokens a minute each caller (each API
key, each member calling without a key) may use on that endpoint (`fleet.proxy.rate_limits` applies them).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError

from audit.services import on, operator_action
from fleet.workloads.models import Endpoint
from tenancy.mixins import require_operator

MAX_PER_MINUTE = 2_147_483_647  # what the columns hold (PostgreSQL integer)
LIMIT_FIELDS = ("key_requests_per_min", "key_tokens_per_min")


def validate_per_minute(name: str, value: Any) -> int | None:
    """`value` as a per-minute limit (None: unlimited); ValidationError naming `name` and the bounds."""
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError({name: "Give a whole number, or leave it empty for no limit."})
    if not 1 <= value <= MAX_PER_MINUTE:
        raise ValidationError({name: f"Give a number from 1 to {MAX_PER_MINUTE}, or leave it empty for no limit."})
    return value


@operator_action(
    "endpoint.set_key_limits",
    target=on("endpoint", "endpoint"),
    detail=lambda kw, _: {name: kw.get(name) for name in LIMIT_FIELDS},
)
def endpoint_set_key_limits(
    *,
    actor: AbstractBaseUser,
    endpoint: Endpoint,
    key_requests_per_min: int | None,
    key_tokens_per_min: int | None,
    staff: bool = False,
) -> Endpoint:
    """Set the endpoint's per-key limits (None: unlimited). Owner/Admin of its workspace, or staff through the
    admin (`staff=True`); 403 otherwise, 400 naming the field for a number out of bounds. The proxy sees the
    new limits within PROXY_ROUTE_CACHE_S (at once in this process)."""
    if not staff:
        require_operator(actor, endpoint.cluster.workspace, what="change an endpoint's limits")
    values = {
        "key_requests_per_min": validate_per_minute("key_requests_per_min", key_requests_per_min),
        "key_tokens_per_min": validate_per_minute("key_tokens_per_min", key_tokens_per_min),
    }
    endpoint = Endpoint.objects.select_for_update(of=("self",)).get(pk=endpoint.pk)
    for name, value in values.items():
        setattr(endpoint, name, value)
    endpoint.save(update_fields=[*values, "updated_at"])
    return endpoint

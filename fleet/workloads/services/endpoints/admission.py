"""Writes for an endpoint's admission settings: the requests in flight each replica takes (`max_concurrency`;
None: the server's --max-num-seqs, else 256) and its wait queue (`queue_max_depth` requests waiting at most
`queue_max_wait_s` seconds; None: ENDPOINT_QUEUE_DEPTH / ENDPOINT_QUEUE_WAIT_S). `fleet.admission` applies
them in the proxy.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError

from audit.services import on, operator_action
from fleet.workloads.models import Endpoint
from tenancy.mixins import require_operator

MAX_CONCURRENCY = 100_000
MAX_QUEUE_DEPTH = 1_000_000
MAX_QUEUE_WAIT_S = 3_600
ADMISSION_FIELDS = ("max_concurrency", "queue_max_depth", "queue_max_wait_s")
_BOUNDS = {"max_concurrency": (1, MAX_CONCURRENCY), "queue_max_depth": (0, MAX_QUEUE_DEPTH)}
_BOUNDS["queue_max_wait_s"] = (1, MAX_QUEUE_WAIT_S)


def validate_admission(name: str, value: Any) -> int | None:
    """`value` as the admission setting `name` (None: the default); ValidationError naming it and its bounds."""
    if value is None or value == "":
        return None
    low, high = _BOUNDS[name]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError({name: f"Give a whole number from {low} to {high}, or leave it empty for the default."})
    return value


@operator_action(
    "endpoint.set_admission",
    target=on("endpoint", "endpoint"),
    detail=lambda kw, _: {name: kw.get(name) for name in ADMISSION_FIELDS},
)
def endpoint_set_admission(
    *,
    actor: AbstractBaseUser,
    endpoint: Endpoint,
    max_concurrency: int | None,
    queue_max_depth: int | None,
    queue_max_wait_s: int | None,
) -> Endpoint:
    """Set the endpoint's concurrency limit per replica and its wait queue's bounds (None: the default).
    Owner/Admin of its workspace (403 otherwise), 400 naming the field for a number out of bounds. No replica
    restarts: the proxy applies them within PROXY_ROUTE_CACHE_S (at once in this process)."""
    require_operator(actor, endpoint.cluster.workspace, what="change an endpoint's queue")
    values = {
        "max_concurrency": validate_admission("max_concurrency", max_concurrency),
        "queue_max_depth": validate_admission("queue_max_depth", queue_max_depth),
        "queue_max_wait_s": validate_admission("queue_max_wait_s", queue_max_wait_s),
    }
    endpoint = Endpoint.objects.select_for_update(of=("self",)).get(pk=endpoint.pk)
    for name, value in values.items():
        setattr(endpoint, name, value)
    endpoint.save(update_fields=[*values, "updated_at"])
    return endpoint

"""Reads of the audit trail, scoped to the user's workspaces, and the filters the API and page share."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from audit.models import AuditEntry, Outcome
from kernel.filters import Filter, FilterSet, as_uuid, choice, text
from tenancy.selectors import scope_to_user


def _when(end_of_day: bool) -> Callable[[str], dt.datetime]:
    """An ISO 8601 date or date-time (naive ones are in the server's time zone); a bare date means the
    start of that day, or its end for `until`."""

    def parse(value: str) -> dt.datetime:
        try:
            day = parse_date(value)
            moment = None if day else parse_datetime(value)
        except ValueError:
            moment = day = None
        if day is not None:
            moment = dt.datetime.combine(day, dt.time.max if end_of_day else dt.time.min)
        if moment is None:
            raise ValidationError("Enter an ISO 8601 date (2025-01-31) or date-time (2025-01-31T12:00:00Z).")
        return timezone.make_aware(moment) if timezone.is_naive(moment) else moment

    parse.schema = {"type": "string", "example": "2025-01-31"}  # type: ignore[attr-defined]
    return parse


AUDIT_FILTERS = FilterSet(
    workspace=Filter("workspace_id", as_uuid),
    actor=Filter("actor_name", text(150)),
    action=Filter("action", text(64)),
    target_type=Filter("target_type", text(32)),
    target_id=Filter("target_id", text(64)),
    outcome=Filter("outcome", choice(Outcome.values)),
    since=Filter("created_at__gte", _when(end_of_day=False)),
    until=Filter("created_at__lte", _when(end_of_day=True)),
)


def audit_entry_list(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[AuditEntry]:
    """Entries of `user`'s workspaces, newest first (filter them with `AUDIT_FILTERS.apply`)."""
    return scope_to_user(AuditEntry.objects.select_related("workspace"), user=user).order_by("-created_at", "-id")

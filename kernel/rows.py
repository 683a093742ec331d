"""Saving rows whose name must be unique in their workspace: a clash is a form error, not a crash."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import IntegrityError, models, transaction


def save_unique_name(row: models.Model, *, message: str, force_insert: bool = False) -> None:
    """Save `row` in a savepoint; when a unique constraint refuses it, raise `ValidationError({"name": message})`.

    The savepoint keeps the caller's transaction usable after the refusal.
    """
    try:
        with transaction.atomic():
            row.save(force_insert=force_insert)
    except IntegrityError:
        raise ValidationError({"name": message}) from None

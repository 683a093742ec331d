"""Celery tasks of managed Ray: thin wrappers around services."""

from __future__ import annotations

from celery import shared_task
from django.db import DatabaseError

from raymgr import services


@shared_task(name="raymgr.tasks.autoscale", autoretry_for=(DatabaseError,), max_retries=2)
def autoscale() -> int:
    """Beat: one autoscaler pass over every running Ray cluster; returns how many were scaled."""
    return services.autoscale_pass()

"""Celery tasks of Ray workloads: thin wrappers around services (imported by `raymgr.apps`)."""

from __future__ import annotations

from celery import shared_task
from django.db import DatabaseError

from raymgr.workloads import services


@shared_task(name="raymgr.tasks.poll_workloads", autoretry_for=(DatabaseError,), max_retries=2)
def poll_workloads() -> int:
    """Beat: submit queued jobs that fit now, ask heads for job / Serve status; returns commands sent."""
    return services.workloads_poll()

"""Celery tasks of Ray workloads: thin wrappers around services (imported by `raymgr.apps`)."""

from __future__ import annotations

from celery import shared_task
from django.db import DatabaseError

from raymgr.workloads import services


@shared_task(name="raymgr.tasks.poll_workloads", autoretry_for=(DatabaseError,), max_retries=2)
def poll_workloads() -> int:
    """Beat: submit queued jobs that fit now, ask heads for job / Serve status; returns commands sent."""
    return services.workloads_poll()


@shared_task(name="raymgr.tasks.dispatch_ray_queue", autoretry_for=(DatabaseError,), max_retries=2)
def dispatch_ray_queue(cluster_id: str) -> int:
    """Event (a job finished, a Ray node started, a job created): start the cluster's queued jobs that fit."""
    return len(services.ray_queue_dispatch(cluster_id=cluster_id))

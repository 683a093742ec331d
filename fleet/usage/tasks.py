"""Celery tasks of usage metering (listed in CELERY_IMPORTS; the beat runs `sample_usage` each minute)."""

from __future__ import annotations

from celery import shared_task

from fleet.usage import services


@shared_task(name="fleet.usage.tasks.sample_usage", ignore_result=True)
def sample_usage() -> int:
    """Credit the clusters with the node, GPU and container seconds of the minute that ended.

    No retry: a rerun for the same minute sets the same figures, and a missed minute is uncounted time.
    """
    return services.usage_sample()

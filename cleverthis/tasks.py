"""Celery tasks of the root: the home page's fleet rollups (`cleverthis.fleet_history`)."""

from __future__ import annotations

from celery import shared_task

from cleverthis import fleet_history


@shared_task(name="cleverthis.tasks.sample_fleet_history", ignore_result=True)
def sample_fleet_history() -> int:
    """Record this minute's nodes and Ray clusters by state and the fleet's utilization, per workspace.

    No retry: the next minute's run samples again (a missed minute is a gap in the charts, nothing else).
    """
    return fleet_history.fleet_history_sample()

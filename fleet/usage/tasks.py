"""Celery tasks of usage metering (listed in CELERY_IMPORTS; the beat runs `sample_usage` each minute)."""

from __future__ import annotations

import logging

from celery import shared_task

from fleet.usage import services


@shared_task(name="fleet.usage.tasks.sample_usage", ignore_result=True)
def sample_usage() -> int:
    """Credit the clusters with the node, GPU and container seconds of the minute that ended.

    No retry: a rerun for the same minute sets the same figures, and a missed minute is uncounted time.
    """
    return services.usage_sample()


@shared_task(name="fleet.usage.tasks.evaluate_budgets", ignore_result=True)
def evaluate_budgets() -> int:
    """The month's spend of every budget, its alerts and the hard stops; returns how many are stopped."""
    return services.budgets_evaluate()


@shared_task(
    name="fleet.usage.tasks.budget_webhook",
    ignore_result=True,
    autoretry_for=(OSError,),
    retry_backoff=True,
    max_retries=5,
)
def budget_webhook(url: str, payload: dict) -> None:
    """POST one budget alert to the Owner's webhook (retried on network errors)."""
    import requests

    response = requests.post(url, json=payload, timeout=10)
    if response.status_code >= 500:
        raise OSError(f"webhook answered {response.status_code}")
    if response.status_code >= 400:
        logging.getLogger(__name__).warning("budget webhook %s refused: %s", url, response.status_code)

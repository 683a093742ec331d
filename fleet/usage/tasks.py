"""Celery tasks of usage metering (listed in CELERY_IMPORTS; the beat runs `sample_usage` each minute)."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from fleet.usage import budgets, services
from kernel import outbound_urls


@shared_task(name="fleet.usage.tasks.sample_usage", ignore_result=True)
def sample_usage() -> int:
    """Credit the clusters with the node, GPU and container seconds of the minute that ended.

    No retry: a rerun for the same minute sets the same figures, and a missed minute is uncounted time.
    """
    return services.usage_sample()


@shared_task(name="fleet.usage.tasks.evaluate_budgets", ignore_result=True)
def evaluate_budgets() -> int:
    """The month's spend of every budget, its alerts and the hard stops; returns how many are stopped."""
    return budgets.budgets_evaluate()


@shared_task(
    name="fleet.usage.tasks.budget_webhook",
    ignore_result=True,
    autoretry_for=(OSError,),
    retry_backoff=True,
    max_retries=5,
)
def budget_webhook(url: str, payload: dict) -> None:
    """POST one budget alert to the Owner's webhook (retried on network errors); never to an address that is
    not public (`kernel.outbound_urls`), and no redirect is followed."""
    import requests

    problem = outbound_urls.resolved_problem(url, settings.OUTBOUND_URL_ALLOWED_HOSTS)
    if problem is not None:
        logging.getLogger(__name__).warning("budget webhook %s not called: %s", url, problem)
        return
    response = requests.post(url, json=payload, timeout=10, allow_redirects=False)
    if response.status_code >= 500:
        raise OSError(f"webhook answered {response.status_code}")
    if response.status_code >= 400:
        logging.getLogger(__name__).warning("budget webhook %s refused: %s", url, response.status_code)

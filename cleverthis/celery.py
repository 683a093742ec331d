"""Celery application: Redis broker, JSON only, tasks discovered from the apps."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleverthis.settings.base")

app = Celery("cleverthis")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.task(name="cleverthis.ping")
def ping(value: str = "pong") -> str:
    """Echo `value`; used to check that a worker is consuming from the broker."""
    return value

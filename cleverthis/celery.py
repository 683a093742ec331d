"""Celery application: Redis broker, JSON only, tasks discovered from the apps."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from celery import Celery

from cleverthis import kombu_fixes

# A worker that loses Redis under load must reconnect, not exit (see `cleverthis.kombu_fixes`).
kombu_fixes.apply()

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleverthis.settings.base")

app = Celery("cleverthis")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@app.on_after_configure.connect
def _make_beat_schedule_dir(sender: Celery, **_: Any) -> None:
    """Beat opens its schedule file (per checkout, under var/ by default) before any other hook runs."""
    Path(sender.conf.beat_schedule_filename).parent.mkdir(parents=True, exist_ok=True)


@app.task(name="cleverthis.ping")
def ping(value: str = "pong") -> str:
    """Echo `value`; used to check that a worker is consuming from the broker."""
    return value

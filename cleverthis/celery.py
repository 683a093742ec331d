"""Celery application: Redis broker, JSON only, tasks discovered from the apps, a consumer heartbeat."""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any

from celery import Celery, bootsteps
from celery.worker.consumer import Consumer
from django.conf import settings
from redis.exceptions import RedisError

from cleverthis import kombu_fixes
from cleverthis.dispatch_health import heartbeat_record, heartbeats_prune

# A worker that loses Redis under load must reconnect, not exit (see `cleverthis.kombu_fixes`).
kombu_fixes.apply()

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleverthis.settings.base")

logger = logging.getLogger(__name__)

app = Celery("cleverthis")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.autodiscover_tasks(["cleverthis"])  # the root's own tasks (cleverthis/tasks.py): the root is no installed app


class ReconnectingConsumer(Consumer):
    """Celery's consumer (the worker_consumer setting), trying a lost broker again at least every
    BROKER_RECONNECT_INTERVAL_MAX_S seconds.

    Celery reconnects with kombu's default waits, 2, 4, 6, ... up to 30 s between attempts and not
    configurable, so after an outage of a minute the worker could notice Redis is back only 30 s later.
    """

    def ensure_connected(self, conn: Any) -> Any:
        cap = float(settings.BROKER_RECONNECT_INTERVAL_MAX_S)
        conn.ensure_connection = functools.partial(
            conn.ensure_connection, interval_start=min(1.0, cap), interval_step=1.0, interval_max=cap
        )
        return super().ensure_connected(conn)


class WorkerHeartbeat(bootsteps.StartStopStep):
    """Consumer step: while the task consumer runs, record a heartbeat every WORKER_HEARTBEAT_INTERVAL_S.

    The beat is an entry on the consumer's timer, which the worker's event loop runs, so it stops
    whenever tasks stop being consumed: the worker died, is reconnecting to a lost broker (Celery
    cancels the connection's timer entries; this step starts again after the reconnect), or its loop
    is stuck. What reads it: `cleverthis.dispatch_health`.
    """

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        self.tref: Any = None
        self.hostname = ""
        self.failing = False
        super().__init__(parent, **kwargs)

    def start(self, parent: Any) -> None:
        self.hostname = parent.hostname
        try:
            heartbeats_prune()
        except RedisError:
            pass  # the beat below says so
        self.beat()
        self.tref = parent.timer.call_repeatedly(float(settings.WORKER_HEARTBEAT_INTERVAL_S), self.beat)

    def stop(self, parent: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()
            self.tref = None

    def shutdown(self, parent: Any) -> None:
        self.stop(parent)

    def beat(self) -> None:
        """Record one heartbeat; a broker that does not answer is logged once per outage, never raised."""
        try:
            heartbeat_record(hostname=self.hostname)
        except RedisError as exc:
            if not self.failing:
                logger.warning("worker heartbeat not recorded: %s", exc)
            self.failing = True
        else:
            self.failing = False


app.steps["consumer"].add(WorkerHeartbeat)


@app.on_after_configure.connect
def _make_beat_schedule_dir(sender: Celery, **_: Any) -> None:
    """Beat opens its schedule file (per checkout, under var/ by default) before any other hook runs."""
    Path(sender.conf.beat_schedule_filename).parent.mkdir(parents=True, exist_ok=True)


@app.task(name="cleverthis.ping")
def ping(value: str = "pong") -> str:
    """Echo `value`; used to check that a worker is consuming from the broker."""
    return value

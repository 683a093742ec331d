"""The one seam between the fleet's services and Celery: enqueue a task by its name after commit.

Services never import `fleet.tasks` (tasks import services): they call these helpers, which send the
task by name once the current transaction commits, so a worker never sees rows that are not there yet.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import current_app
from django.db import transaction

logger = logging.getLogger(__name__)

DISPATCH_COMMAND = "fleet.tasks.dispatch_command"
DISPATCH_BATCH = "fleet.tasks.dispatch_batch"
MARK_LOST_NODES_OFFLINE = "fleet.tasks.mark_lost_nodes_offline"


def send(task_name: str, *args: Any, countdown: float | None = None) -> None:
    """Enqueue `task_name(*args)` now, to run `countdown` seconds from now if given (run it in-process,
    at once, when Celery is configured to run eagerly)."""
    app = current_app
    if app.conf.task_always_eager:
        app.tasks[task_name].apply(args=args)
    else:
        app.send_task(task_name, args=args, countdown=countdown)


def on_commit(task_name: str, *args: Any, countdown: float | None = None) -> None:
    """Enqueue `task_name(*args)` once the current transaction commits (at once outside one)."""
    if countdown is None:
        transaction.on_commit(lambda: send(task_name, *args))
    else:
        transaction.on_commit(lambda: send(task_name, *args, countdown=countdown))


def dispatch_command(command_id: Any) -> None:
    """Claim and send one command after commit (best effort: `_dispatch_on_commit`)."""
    _dispatch_on_commit(DISPATCH_COMMAND, str(command_id))


def dispatch_batch(batch_id: Any) -> None:
    """Claim and send every command of a fan-out batch after commit (best effort: `_dispatch_on_commit`)."""
    _dispatch_on_commit(DISPATCH_BATCH, str(batch_id))


def _dispatch_on_commit(task_name: str, key: str) -> None:
    """Enqueue a dispatch task after commit. When the broker refuses (Redis restarting or loading its
    data), the commands are committed already: they wait queued until the beat's resend
    (`fleet.tasks.resend_stuck_commands`) or the node's next hello sends them, and the request that made
    them still succeeds instead of answering 500 for commands that exist (a client retrying would send
    them twice)."""

    def enqueue() -> None:
        try:
            send(task_name, key)
        except Exception as exc:
            logger.warning("enqueueing %s(%s) failed; the beat's resend will send it: %s", task_name, key, exc)

    transaction.on_commit(enqueue)


def mark_lost_nodes_offline(*, countdown: float) -> None:
    """After commit, schedule a lost-nodes pass `countdown` seconds later (a tunnel closed: its grace).

    Best effort: when the broker refuses, the beat's pass (every 15 s) does the same a little later.
    """

    def schedule() -> None:
        try:
            send(MARK_LOST_NODES_OFFLINE, countdown=countdown)
        except Exception as exc:
            logger.warning("scheduling the offline pass failed (the beat's pass will do it): %s", exc)

    transaction.on_commit(schedule)

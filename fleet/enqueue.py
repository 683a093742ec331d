"""The one seam between the fleet's services and Celery: enqueue a task by its name after commit.

Services never import `fleet.tasks` (tasks import services): they call these helpers, which send the
task by name once the current transaction commits, so a worker never sees rows that are not there yet.
"""

from __future__ import annotations

from typing import Any

from celery import current_app
from django.db import transaction

DISPATCH_COMMAND = "fleet.tasks.dispatch_command"
DISPATCH_BATCH = "fleet.tasks.dispatch_batch"
DRAIN_NODE = "fleet.tasks.drain_node"


def send(task_name: str, *args: Any) -> None:
    """Enqueue `task_name(*args)` now (run it in-process when Celery is configured to run eagerly)."""
    app = current_app
    if app.conf.task_always_eager:
        app.tasks[task_name].apply(args=args)
    else:
        app.send_task(task_name, args=args)


def on_commit(task_name: str, *args: Any) -> None:
    """Enqueue `task_name(*args)` once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: send(task_name, *args))


def dispatch_command(command_id: Any) -> None:
    """Claim and send one command after commit."""
    on_commit(DISPATCH_COMMAND, str(command_id))


def dispatch_batch(batch_id: Any) -> None:
    """Claim and send every command of a fan-out batch after commit."""
    on_commit(DISPATCH_BATCH, str(batch_id))


def drain_node(node_id: Any) -> None:
    """Take one drain pass for a node after commit."""
    on_commit(DRAIN_NODE, str(node_id))

"""Connects Ray workloads to fleet at app start: payload validation, command results, the beat task."""

from __future__ import annotations

import logging
from typing import Any

from fleet.models import CommandType

RAY_NODE_STARTS = frozenset({CommandType.RAY_HEAD_START, CommandType.RAY_WORKER_START})


def connect() -> None:
    """Called from `RaymgrConfig.ready()` (idempotent)."""
    from fleet.signals import command_finished
    from raymgr.workloads import payloads, serve_proxy, tasks  # noqa: F401  (registers the task and resolver)

    payloads.register()
    command_finished.connect(_on_command_finished, dispatch_uid="raymgr.workloads_on_command_finished")


def _on_command_finished(sender: object, command: Any, **kwargs: object) -> None:
    """Adapter to the keyword-only service; a workload failure never breaks result recording."""
    from django.db import transaction

    from raymgr.workloads import services

    try:
        with transaction.atomic():
            services.workload_on_command_finished(command=command)
            if command.command_type in RAY_NODE_STARTS and command.status == "succeeded":
                services.enqueue_dispatch((command.payload or {}).get("cluster_id"))  # capacity added: an event
    except Exception:
        logging.getLogger("raymgr").exception(
            "Ray workload follow-up of command %s failed", getattr(command, "pk", "?")
        )

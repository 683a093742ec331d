"""Celery tasks of the fleet: thin wrappers around services, IDs in, explicit retry policy."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import DatabaseError
from redis.exceptions import RedisError

from fleet import services

logger = logging.getLogger(__name__)

RETRYABLE = (DatabaseError, RedisError, ConnectionError, OSError)
# Sending a command: retried with jittered backoff up to ~8 minutes, acknowledged only once sent.
DISPATCH_RETRY = {
    "autoretry_for": RETRYABLE,
    "retry_backoff": 2,
    "retry_backoff_max": 60,
    "retry_jitter": True,
    "max_retries": 8,
    "acks_late": True,
}


@shared_task(name="fleet.tasks.dispatch_command", **DISPATCH_RETRY)
def dispatch_command(command_id: str) -> bool:
    """Claim command `command_id` and send it to its node's tunnel; a no-op if already claimed or gone."""
    return services.command_claim_and_send(command_id=command_id)


@shared_task(name="fleet.tasks.dispatch_batch", **DISPATCH_RETRY)
def dispatch_batch(batch_id: str) -> int:
    """Claim every queued command of batch `batch_id` at once and send each; returns how many were sent."""
    return services.command_batch_claim_and_send(batch_id=batch_id)


@shared_task(name="fleet.tasks.mark_lost_nodes_offline", autoretry_for=(DatabaseError,), max_retries=2)
def mark_lost_nodes_offline() -> int:
    """Beat (and NODE_OFFLINE_GRACE_S after each tunnel close): lost nodes go offline; returns how many."""
    return services.nodes_mark_lost_offline()


@shared_task(name="fleet.tasks.expire_join_tokens", autoretry_for=(DatabaseError,), max_retries=2)
def expire_join_tokens() -> int:
    """Beat: delete expired, unused join tokens; returns how many."""
    return services.join_tokens_expire()


@shared_task(name="fleet.tasks.resend_stuck_commands", autoretry_for=(DatabaseError,), max_retries=2)
def resend_stuck_commands() -> int:
    """Beat: re-send commands that should have reached their connected node by now; returns how many."""
    return services.commands_resend_stuck()

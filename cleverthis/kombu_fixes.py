"""A fix to kombu's Redis transport, so a Celery worker survives losing its broker.

The bug (kombu 5.7.0 with Celery 5.7.0; the same class as celery/kombu#582 and celery/celery#10205):
when Redis goes away under load, the worker's consumer handles the connection error in
`Consumer.on_connection_error_after_connected`:

1. `connection.collect()` closes the default channel. Its `close()` first reads the pending BRPOP, which
   raises a connection error (ignored), so the channel stays open; then `collect()` detaches the
   transport from its connection (`transport.client = None`).
2. `connection.close()` closes the same channel again. `Channel.close()` drops its connection pools and
   then restores the unacknowledged messages (`QoS.restore_unacked_once`): with a task in flight
   (`task_acks_late`) that needs a client, so a new pool, and building one reads
   `self.connection.client.hostname` from the detached transport: `AttributeError`.

An `AttributeError` is not one of the errors the consumer recovers from, so the worker logs
`Unrecoverable error: AttributeError("'NoneType' object has no attribute 'hostname'")` and exits; no
configuration avoids it (the restore runs whenever a message is unacknowledged at that moment). Acking
a message of the old channel after the reconnect takes the same path.

The fix: a channel whose transport has been detached from its connection raises redis's
`ConnectionError` when it needs a new pool, the error kombu and Celery already treat as "the broker
connection is gone" (ignored when closing, logged when acking). The unacknowledged messages stay in
the broker's unacked index, where the visibility-timeout sweep hands them out again (and the fleet's
beat re-sends commands whose dispatch task was lost either way). `apply()` is called from
`cleverthis.celery`; drop this module once kombu guards the detached transport itself.
"""

from __future__ import annotations

import functools
from typing import Any

from kombu.transport import redis as redis_transport
from redis.exceptions import ConnectionError as RedisConnectionError

DETACHED_MESSAGE = "the broker connection of this channel is closed (kombu transport detached)"


def apply() -> None:
    """Make kombu's Redis channels raise a connection error, not AttributeError, once detached (idempotent)."""
    channel = redis_transport.Channel
    original = channel._connparams
    if getattr(original, "guards_detached_transport", False):
        return

    @functools.wraps(original)
    def connparams(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        transport = self.connection
        if transport is None or transport.client is None:
            raise RedisConnectionError(DETACHED_MESSAGE)
        return original(self, *args, **kwargs)

    connparams.guards_detached_transport = True  # type: ignore[attr-defined]
    channel._connparams = connparams

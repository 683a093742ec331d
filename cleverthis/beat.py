"""Beat's scheduler: Celery's persistent one, riding through a broker (Redis) restart.

A due task is published with retries spanning BEAT_PUBLISH_RETRY (about 15 s), so a Redis restart of a
few seconds delays it instead of dropping it. A publish that fails anyway is one warning line naming
the entry (it is sent again at its next time), not Celery's chained traceback whose last line read
"IndexError: pop from empty list" (kombu's pool of channels, empty after the connection broke: the
cause was the refused connection above it).
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from celery.beat import PersistentScheduler, ScheduleEntry, SchedulingError

logger = logging.getLogger("cleverthis.beat")

# kombu's publish retry: 0.5 s, then 1 s, 1.5 s, 2 s … up to 2 s, at most 10 tries (~15 s in all).
BEAT_PUBLISH_RETRY: dict[str, float] = {
    "max_retries": 10,
    "interval_start": 0.5,
    "interval_step": 0.5,
    "interval_max": 2.0,
}


class BrokerTolerantScheduler(PersistentScheduler):
    """`PersistentScheduler` whose publishes retry through a broker restart and fail in one line."""

    def apply_async(self, entry: ScheduleEntry, producer: Any = None, advance: bool = True, **kwargs: Any) -> Any:
        """As Celery's, each entry published with `retry=True` and BEAT_PUBLISH_RETRY (unless it says)."""
        sent = copy.copy(entry)
        sent.options = {"retry": True, "retry_policy": BEAT_PUBLISH_RETRY, **(entry.options or {})}
        return super().apply_async(sent, producer=producer, advance=advance, **kwargs)

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        """Send a due entry; a failure (the broker away) is logged in one line: the next run sends it."""
        logger.info("Scheduler: Sending due task %s (%s)", entry.name, entry.task)
        try:
            self.apply_async(entry, producer=producer, advance=False)
        except SchedulingError as exc:
            logger.warning("beat could not send %s (sent again at its next run): %s", entry.name, exc)

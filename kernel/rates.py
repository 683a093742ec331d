"""Request rates as the settings write them (`30/min`), read by the settings and the request limits."""

from __future__ import annotations

import re

_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*(s|sec|second|m|min|minute|h|hour|d|day)s?\s*$")
_PERIOD_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(text: str) -> tuple[int, int]:
    """`"30/min"` → (30 requests, per 60 seconds); also `10/s`, `100/hour`, `1000/day`, `5/10min`."""
    match = _RATE.match(text or "")
    if match is None:
        raise ValueError(f"a rate looks like 30/min (count/[n]s|min|hour|day), got {text!r}")
    count, times, unit = match.groups()
    return int(count), int(times or 1) * _PERIOD_S[unit[0]]

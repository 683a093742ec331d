"""Request limits: fixed-window counters in the cache (Redis), rates read from settings on every request.

`hit(scope, ident, rate)` counts one request and says how long to wait when it is over the limit.
`SettingsRateThrottle` is the DRF throttle built on it (unlike DRF's `SimpleRateThrottle`, which reads
its rates once at import, a changed setting applies at once); `sign_in_throttled` guards sign-in forms.
The client is `kernel.client_address`'s: the socket's peer, or what a TRUSTED_PROXIES proxy forwarded (a
client-sent X-Forwarded-For is never believed).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from rest_framework.throttling import BaseThrottle

from kernel.client_address import request_client_ip
from kernel.rates import parse_rate

logger = logging.getLogger(__name__)

KEY_PREFIX = "throttle"


def client_ip(request: HttpRequest) -> str:
    """The address the request came from (never a header the client could set), or "unknown"."""
    return request_client_ip(request) or "unknown"


def cache_key(scope: str, ident: str, window: int) -> str:
    """The counter of `ident` in `scope` for one window; `ident` is hashed (any text, fixed length)."""
    digest = hashlib.sha256(ident.encode("utf-8")).hexdigest()[:32]
    return f"{KEY_PREFIX}:{scope}:{digest}:{window}"


def hit(scope: str, ident: str, rate: str) -> int:
    """Count one request of `ident` in `scope` against `rate` (e.g. "30/min").

    Returns 0 when it is within the limit, else the seconds until the current window ends (what
    Retry-After says). A cache that cannot be reached lets the request through (logged).
    """
    limit, period = parse_rate(rate)
    now = time.time()
    window = int(now // period)
    left = max(1, math.ceil((window + 1) * period - now))
    key = cache_key(scope, ident, window)
    try:
        cache.add(key, 0, timeout=left + 1)
        try:
            count = cache.incr(key)
        except ValueError:  # expired between add and incr (the window just ended)
            cache.add(key, 1, timeout=left + 1)
            count = 1
    except Exception:  # a limit must not turn a cache outage into errors
        logger.warning("request limit %s not checked: the cache is unreachable", scope, exc_info=True)
        return 0
    return 0 if count <= limit else left


class SettingsRateThrottle(BaseThrottle):
    """Per client IP, at the rate held by the setting named `rate_setting`, read on each request."""

    scope = ""
    rate_setting = ""

    def allow_request(self, request: Any, view: Any) -> bool:
        self._wait = hit(self.scope, client_ip(request), getattr(settings, self.rate_setting))
        return self._wait == 0

    def wait(self) -> float | None:
        return self._wait or None


def sign_in_throttled(request: HttpRequest) -> HttpResponse | None:
    """A 429 page (with Retry-After) when this sign-in POST is over SIGN_IN_RATE, else None.

    Counted per client IP and per username (case-insensitive): guessing many passwords of one
    account from many addresses, or of many accounts from one address, both run into the limit.
    """
    if request.method != "POST":
        return None
    rate = settings.SIGN_IN_RATE
    wait = hit("sign-in-ip", client_ip(request), rate)
    username = str(request.POST.get("username", "")).strip().lower()
    if username:
        wait = max(wait, hit("sign-in-user", username, rate))
    if not wait:
        return None
    response = render(request, "registration/throttled.html", {"retry_after": wait}, status=429)
    response["Retry-After"] = str(wait)
    return response

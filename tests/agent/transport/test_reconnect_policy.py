"""Reconnect delays: exponential backoff with full jitter, first retry under a second, capped."""

from __future__ import annotations

import random

from agent.transport.tunnel import ReconnectPolicy


def test_first_retry_is_under_one_second():
    policy = ReconnectPolicy(rng=random.Random(1))
    assert all(0 <= policy.delay(0) < 1.0 for _ in range(1000))


def test_delays_grow_then_cap_and_stay_jittered():
    policy = ReconnectPolicy(base_s=0.5, cap_s=5.0, rng=random.Random(2))
    samples = {attempt: [policy.delay(attempt) for _ in range(2000)] for attempt in range(8)}
    assert max(samples[1]) <= 1.0 < max(samples[3]) <= 4.0
    assert all(d <= 5.0 for attempt in range(8) for d in samples[attempt])
    # full jitter: small delays remain possible even at the cap, so a restarted control plane is not stampeded
    assert min(samples[7]) < 0.5
    assert max(samples[7]) > 4.5

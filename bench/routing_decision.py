"""What one routing decision costs: p50/p99 of choosing a replica among 8, per policy, in process.

    .venv/bin/python bench/routing_decision.py                 # 8 replicas, 200,000 decisions per policy
    .venv/bin/python bench/routing_decision.py --replicas 16 --decisions 50000

A decision is what the relay does per request before it dials (`relay.proxy_http`): build the request's
`Lease` (for `session` and `prefix`: hash its affinity key), `take` (least load over the shared figures, or
the consistent-hash ring walk with the load bound) and `release`. The replicas carry some load so ties and
the bound are exercised: the other web processes' figures are set (`balancer.set_shared`) and a quarter of
the decisions' leases stay held for a while. Reading the affinity key from a chat body (`fleet.proxy.affinity`:
a JSON parse of the body) is measured apart, for a small body and for a 1,500-token system prompt with a
six-turn history, since its cost grows with the body, not with the number of replicas.

Each policy is timed twice: the bare lease, and the lease an endpoint with a concurrency limit and a wait
queue takes (`fleet.admission`: `lease_for` + `Gate.admit`, the fast path of a free slot with nobody waiting,
driven without an event loop since it never suspends), so the admission's own cost shows side by side.

Printed: p50, p99 and max in µs per policy, PASS/MISS against the goal (p99 < 50 µs with 8 replicas), and
the machine's load average (the timings are of this process on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleverthis.settings.base")

import django  # noqa: E402

django.setup()

from fleet import admission, balancer  # noqa: E402
from fleet.balancer import Lease, Upstream  # noqa: E402
from fleet.proxy import affinity  # noqa: E402

GOAL_P99_US = 50.0


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def decisions(policy: str, replicas: tuple[Upstream, ...], count: int, keys: list[bytes]) -> list[float]:
    """Time `count` decisions (Lease + take + release) in µs; a quarter of the leases are held for a while."""
    held: list[Lease] = []
    samples: list[float] = []
    clock = time.perf_counter_ns
    for i in range(count):
        key = keys[i % len(keys)] if policy != balancer.LEAST_LOAD else None
        start = clock()
        lease = Lease(replicas, policy, key)
        lease.take()
        if i % 4:
            lease.release()
        samples.append((clock() - start) / 1000)
        if not i % 4:
            held.append(lease)
            if len(held) > 24:  # some requests in flight all along
                held.pop(0).release()
    for lease in held:
        lease.release()
    return samples


def admitted(policy: str, replicas: tuple[Upstream, ...], count: int, keys: list[bytes]) -> list[float]:
    """As `decisions`, through an endpoint's admission (limit 256, a free slot: the fast path) in µs."""
    queue = admission.QueuePolicy(endpoint="bench", limit=256, depth=1024, wait_s=60.0)
    gate = admission.gate(queue)
    held: list[Lease] = []
    samples: list[float] = []
    clock = time.perf_counter_ns
    for i in range(count):
        key = keys[i % len(keys)] if policy != balancer.LEAST_LOAD else None
        start = clock()
        lease = admission.lease_for(queue, replicas, policy, key)
        step = gate.admit(lease, "caller")
        try:
            step.send(None)
            raise RuntimeError("admission waited: the bench wants the fast path")
        except StopIteration:
            pass
        if i % 4:
            lease.release()
        samples.append((clock() - start) / 1000)
        if not i % 4:
            held.append(lease)
            if len(held) > 24:
                held.pop(0).release()
    for lease in held:
        lease.release()
    return samples


def key_reading(body: bytes, count: int) -> list[float]:
    scope = {"headers": [(b"content-type", b"application/json")]}
    samples = []
    for _ in range(count):
        start = time.perf_counter_ns()
        affinity.affinity_key(balancer.PREFIX, scope, body)
        samples.append((time.perf_counter_ns() - start) / 1000)
    return samples


def chat_body(system_words: int, turns: int) -> bytes:
    messages = [
        {"role": "system", "content": " ".join(random.choice(["alpha", "beta", "gamma"]) for _ in range(system_words))}
    ]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"question {turn} " + "word " * 150})
        messages.append({"role": "assistant", "content": f"answer {turn} " + "word " * 150})
    messages.append({"role": "user", "content": "last question"})
    return json.dumps({"model": "m", "messages": messages, "stream": True}).encode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--decisions", type=int, default=200_000)
    args = parser.parse_args()
    random.seed(1)
    replicas = tuple(
        Upstream(key=uuid.uuid4().hex[:12], node_id=uuid.uuid4(), port=8000 + i) for i in range(args.replicas)
    )
    balancer.set_shared({u.key: random.randint(0, 6) for u in replicas}, {})  # the other processes' requests
    keys = [f"conversation {i}: a leading prompt text of some length".encode() for i in range(5_000)]
    print(f"routing decision, {args.replicas} replicas, {args.decisions} decisions per policy")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    worst = 0.0
    for policy in balancer.POLICIES:
        for label, measure in (("", decisions), (" + queue", admitted)):
            measure(policy, replicas, 5_000, keys)  # warm up (the ring is built on first use)
            samples = measure(policy, replicas, args.decisions, keys)
            p50, p99 = percentile(samples, 0.50), percentile(samples, 0.99)
            worst = max(worst, p99)
            mean, top = statistics.fmean(samples), max(samples)
            name = policy + label
            print(f"  {name:<19} p50 {p50:6.1f} µs   p99 {p99:6.1f} µs   max {top:8.1f} µs   mean {mean:5.1f} µs")
    verdict = "PASS" if worst < GOAL_P99_US else "MISS"
    print(f"decision p99 (worst policy) {worst:.1f} µs, goal < {GOAL_P99_US:.0f} µs with 8 replicas: {verdict}")
    for label, body in (
        ("small chat body", chat_body(20, 0)),
        ("1,500-token system prompt, 6 turns", chat_body(1500, 6)),
    ):
        samples = key_reading(body, 5_000)
        print(
            f"  prefix key from a {label} ({len(body):,} bytes): p50 {percentile(samples, 0.5):6.1f} µs"
            f"   p99 {percentile(samples, 0.99):6.1f} µs"
        )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())

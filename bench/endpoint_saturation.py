"""Twice an endpoint's capacity offered, measured on real agents: held, not refused; what is refused gets 429.

    .venv/bin/python bench/endpoint_saturation.py                      # a real vLLM CPU replica (.ci/vllm-venv)
    .venv/bin/python bench/endpoint_saturation.py --engine standin     # the OpenAI stand-in (quick, no vLLM)

The set-up is `bench/endpoint_scaling.py`'s (PostgreSQL, a private redis-server, one web replica, a worker,
beat, the Hub stand-in serving a tiny Llama, two agents, each pinned to a core with vLLM). One endpoint of
one replica whose server runs with `--max-num-seqs --limit` (the endpoint's concurrency limit, taken from
it) and a queue of `--depth` requests waiting at most `--wait-s` s: its capacity is limit + depth requests
held at once. Twice that many clients then stream completions back to back through the endpoint's URL for
`--duration-s` (a client refused with 429 waits the `Retry-After` it was given, as a polite client does;
with the stand-in each answer is held `--standin-delay-s`, a service time vLLM has of its own).

Printed: requests, answered (200), refused with 429 (and how many carried `Retry-After` and a JSON reason),
5xx and other failures, TTFT p50/p99 of the answered, and the endpoint's own figures as the product shows
them (its API's `queue`, read every half second): the most requests seen waiting, queue wait p50/p99 of
the last window at the end and the worst p99 seen. Goals (issue 45): zero 5xx; every request answered or
refused with 429 + Retry-After. The machine's load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("BENCH_DB", "cleverthis_bench_saturation")  # (a database of its own, dropped at the end)

from endpoint_scaling import MODEL, pct, setup, stop_endpoint, wait_running  # (sets Django up)


@dataclass
class Answer:
    status: int  # 0: no HTTP answer
    ttft: float | None = None
    retry_after: str = ""
    reason: str = ""  # a 429's error type
    error: str = ""


def stream(session: object, url: str, headers: dict[str, str], args: argparse.Namespace) -> Answer:
    """One streamed completion through the endpoint's URL."""
    body: dict[str, object] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "the fleet runs"}],
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    if args.engine == "standin":
        body["standin_delay_s"] = args.standin_delay_s
    started = time.monotonic()
    try:
        with session.post(f"{url}/v1/chat/completions", json=body, headers=headers, stream=True, timeout=900) as r:
            if r.status_code != 200:
                reason = ""
                if r.status_code == 429:
                    try:
                        reason = r.json()["error"]["type"]
                    except (ValueError, KeyError, TypeError):
                        reason = "(no JSON reason)"
                return Answer(r.status_code, retry_after=r.headers.get("retry-after", ""), reason=reason)
            ttft = None
            for line in r.iter_lines():
                if line.startswith(b"data: ") and line != b"data: [DONE]" and ttft is None:
                    choices = json.loads(line[6:]).get("choices") or [{}]
                    if choices[0].get("delta", {}).get("content"):
                        ttft = time.monotonic() - started
            return Answer(200, ttft)
    except Exception as exc:  # a failure of its own kind: counted apart from the HTTP answers
        return Answer(0, error=f"{type(exc).__name__}: {exc}")


def run(bench: object, args: argparse.Namespace) -> list[str]:
    import requests

    from fleet.workloads.selectors import queue_loads
    from fleet.workloads.services import endpoint_create

    endpoint = endpoint_create(
        actor=bench.user,
        cluster=bench.cluster,
        model_id=MODEL,
        server_args=["--max-num-seqs", str(args.limit)],
        queue_max_depth=args.depth,
        queue_max_wait_s=args.wait_s,
    )
    wait_running(endpoint, 1)
    capacity = endpoint.concurrency_limit + args.depth
    clients = 2 * capacity
    headers = bench.headers_for(endpoint)
    answers: list[Answer] = []
    stop = threading.Event()

    def client() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                answer = stream(session, bench.plane.url, headers, args)
                answers.append(answer)
                if answer.status == 429 and answer.retry_after.isdigit():
                    stop.wait(int(answer.retry_after))

    load_before = os.getloadavg()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    most_waiting, worst_p99, last = 0, 0.0, None
    ends = time.monotonic() + args.duration_s
    while time.monotonic() < ends:
        time.sleep(0.5)
        last = queue_loads().get(str(endpoint.pk)) or last
        if last is not None:
            most_waiting = max(most_waiting, last.waiting)
            worst_p99 = max(worst_p99, last.wait_p99_s or 0.0)
    stop.set()
    for thread in threads:
        thread.join(timeout=900)
    load_after = os.getloadavg()
    stop_endpoint(bench, endpoint)
    ok = [a for a in answers if a.status == 200]
    refused = [a for a in answers if a.status == 429]
    polite = [a for a in refused if a.retry_after.isdigit() and a.reason in ("queue_full", "queue_timeout")]
    server_errors = [a for a in answers if a.status >= 500]
    others = [a for a in answers if a.status not in (200, 429) and a.status < 500]
    ttfts = [a.ttft * 1000 for a in ok if a.ttft is not None]
    verdict = "PASS" if not server_errors and not others and len(polite) == len(refused) else "MISS"
    reasons = {r: sum(1 for a in refused if a.reason == r) for r in sorted({a.reason for a in refused})}
    return [
        f"saturation: limit {endpoint.concurrency_limit} (--max-num-seqs), queue depth {args.depth}, wait bound "
        f"{args.wait_s} s: capacity {capacity} held; {clients} clients for {args.duration_s:.0f} s",
        f"  load average before {load_before[0]:.2f}, after {load_after[0]:.2f} ({os.cpu_count()} CPUs)",
        f"  requests {len(answers)}: answered 200 {len(ok)}, refused 429 {len(refused)} {reasons} "
        f"({len(polite)} with Retry-After and a JSON reason), 5xx {len(server_errors)}, other {len(others)}",
        f"  TTFT of the answered p50 {pct(ttfts, 0.5):.0f} ms, p99 {pct(ttfts, 0.99):.0f} ms",
        f"  the endpoint's queue (its API): most waiting {most_waiting}; wait p99 worst {worst_p99:g} s; at the end "
        f"p50 {last.wait_p50_s if last else None} s, p99 {last.wait_p99_s if last else None} s",
        f"  goal: zero 5xx, every request answered or refused with 429 + Retry-After: {verdict}",
        *(f"    {a.status} {a.error}" for a in [*server_errors, *others][:5]),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("vllm", "standin"), default="vllm")
    parser.add_argument("--limit", type=int, default=4, help="the server's --max-num-seqs: the concurrency limit")
    parser.add_argument("--depth", type=int, default=4, help="the endpoint's queue depth")
    parser.add_argument("--wait-s", type=int, default=30, help="the endpoint's queue wait bound (s)")
    parser.add_argument("--duration-s", type=float, default=60)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--standin-delay-s", type=float, default=0.5, help="the stand-in's service time (s)")
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-saturation-"))
    lines = [f"engine: {args.engine}; logs in {log_dir}"]
    try:
        with setup(args.engine, log_dir, pin_nodes=args.engine == "vllm") as bench:
            lines += run(bench, args)
    finally:
        print("\n".join(lines), flush=True)
    shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Routing policies side by side on real vLLM CPU replicas with prefix caching: what affinity is worth.

    .venv/bin/python bench/routing_policies.py                        # every phase (about 20 minutes here)
    .venv/bin/python bench/routing_policies.py --phases multiturn      # some phases only
    .venv/bin/python bench/routing_policies.py --policies least_load prefix
    .venv/bin/python bench/routing_policies.py --phases multiturn --policies least_load session prefix least_load
    .venv/bin/python bench/routing_policies.py --phases overhead --web-env PROXY_KEEP_WARM_S=0   # the proxy as before
    .venv/bin/python bench/routing_policies.py --engine standin --phases overhead --agents-anywhere    # no vLLM

The set-up is `bench/endpoint_scaling.py`'s (PostgreSQL, a private Redis, one uvicorn web replica, a Celery
worker and beat, the Hub stand-in, two real agents each pinned to a CPU core of its own, so each vLLM server
runs on one core as on two machines), serving `bench/timing_llama.py`'s random-weight Llama (hidden 256,
6 layers, 32,000 words, one word = one token: a 2,000-token cold prefill ~0.8 s on one core here). Each
endpoint has two replicas with `--enable-prefix-caching --max-num-seqs 8 --max-model-len 4096`. Every request
goes through the endpoint's URL (web → tunnel → agent → server) with an API key, streamed, sent by
`fleet.workloads.loadgen` (the Benchmark button's generator), with `X-Session-Id` set to its conversation.
Between policies only the routing policy changes (at once, no restart); each run has prompts of its own
(another seed), so no run finds the previous run's prefixes cached.

Phases:
- multiturn: 16 concurrent conversations x 6 turns behind one 1,500-token system prompt, ~150 tokens added per
  turn (a 118-word question and the 32-token answer) after a pause of 0-2 s (`--think-s` 1: a user reading and
  typing; without it a closed loop keeps least-load nearly sticky by itself, as the replica a conversation just
  left is the one with a free slot), on an endpoint whose KV caches (`--num-gpu-blocks-override --kv-blocks`,
  128 tokens a block: 9,216 tokens by default) hold about one replica's share of the conversations (~8,700
  tokens) but far from all of them (~15,900): the busy-GPU case. Printed per policy: TTFT p50/p99, output
  tokens/s, the servers' prefix-cache hit rate (vLLM's own counters) and the ratios to `least_load`. Goal:
  `prefix` and `session` TTFT p50 ≤ 0.6x and throughput ≥ 1.3x of `least_load`.
- uniform: 8 clients sending random 400-word prompts (32 tokens out) for `--uniform-s`: no policy more than 5 %
  worse than `least_load` in throughput or TTFT p50.
- overload: twice the endpoint's capacity (2 replicas x `--max-num-seqs` 8 = 16) offered: 32 clients for
  `--overload-s`. Goal: zero 5xx; every request answered or refused with 429 + `Retry-After`. Queue wait
  p50/p99 over the last window, as the web processes publish them (`selectors.queue_loads`).
- overhead: one request at a time (64 words in, 4 tokens out), alternating through the proxy and straight to
  the same replica's port: TTFT p50 of each; goal: the proxy adds ≤ 5 ms. `--agents-anywhere` measures it
  again with the agents' own threads free to run on either core (each agent shares its pinned core with its
  busy server otherwise); `--web-env NAME=VALUE` changes the control plane's settings for the run
  (`PROXY_KEEP_WARM_S=0`: its caches read on demand by the requests, as before #45's fix).
- ample: the multi-turn workload again on an endpoint with the agents' default KV cache (1 GiB: 87,296 tokens,
  nothing evicted): the figures are reported (affinity gains less there).

The machine's load average is printed with each phase: its other users share these two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("BENCH_DB", "cleverthis_bench_routing")

from endpoint_scaling import MODEL, Bench, setup, stop_endpoint, wait_running  # noqa: E402  (django.setup())
from timing_llama import build as build_timing_llama  # noqa: E402

from fleet.workloads import loadgen  # noqa: E402

POLICIES = ("least_load", "session", "prefix")
SERVER_ARGS = ["--enable-prefix-caching", "--max-num-seqs", "8", "--max-model-len", "4096"]


def load() -> str:
    return "load average " + " ".join(f"{v:.2f}" for v in os.getloadavg())


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def run_load(url: str, headers: dict[str, str], spec: loadgen.LoadSpec) -> dict[str, Any]:
    outcomes, elapsed = asyncio.run(loadgen.run(url, headers, spec))
    return loadgen.summarise(outcomes, elapsed)


def cache_counters(ports: list[int]) -> tuple[float, float]:
    """(prefix-cache hits, queries) in tokens, summed over the servers (vLLM's /metrics)."""
    hits = queries = 0.0
    for port in ports:
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        for name, value in re.findall(r"^vllm:prefix_cache_(hits|queries)_total\{[^}]*\} ([0-9.e+]+)$", text, re.M):
            if name == "hits":
                hits += float(value)
            else:
                queries += float(value)
    return hits, queries


def routed_counts(endpoint: Any) -> dict[str, tuple[int, int]]:
    """{replica server id: (requests routed, affinity hits)} as the web processes publish them."""
    from fleet.workloads import selectors
    from fleet.workloads.models import EndpointReplica

    loads = selectors.replica_loads()
    ids = EndpointReplica.objects.filter(endpoint=endpoint, status="running").values_list("server_id", flat=True)
    return {sid: (loads[sid].routed, loads[sid].affinity_hits) if sid in loads else (0, 0) for sid in sorted(ids)}


def routed_line(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> str:
    """Per replica, the requests routed and affinity hits of one run (a count reset meanwhile: taken whole)."""
    parts = []
    for sid, (routed, hits) in after.items():
        was = before.get(sid, (0, 0))
        if routed < was[0]:
            was = (0, 0)
        parts.append(f"{routed - was[0]} ({hits - was[1]} hits)")
    return "  routed per replica " + " / ".join(parts)


def queue_wait_figures(endpoint: Any) -> str | None:
    """The endpoint's queue wait p50/p99 over the last window, as the web processes publish them (None: none)."""
    from fleet.workloads import selectors

    queue = selectors.queue_loads().get(str(endpoint.pk))
    if queue is None or not queue.admitted:
        return None
    return (
        f"p50 {queue.wait_p50_s * 1000:.0f} ms, p99 {queue.wait_p99_s * 1000:.0f} ms over the last "
        f"{queue.admitted} requests admitted (refused {queue.refused})"
    )


def start_endpoint(bench: Bench, server_args: list[str]) -> tuple[Any, list[int]]:
    from fleet.workloads.models import EndpointReplica
    from fleet.workloads.services import endpoint_create

    endpoint = endpoint_create(
        actor=bench.user, cluster=bench.cluster, model_id=MODEL, min_replicas=2, max_replicas=2, server_args=server_args
    )
    wait_running(endpoint, 2)
    ports = [r.port for r in EndpointReplica.objects.filter(endpoint=endpoint, status="running")]
    return endpoint, ports


def set_policy(bench: Bench, endpoint: Any, policy: str) -> Any:
    from django.conf import settings

    from fleet.workloads.models import Endpoint
    from fleet.workloads.services import endpoint_set_routing

    endpoint = Endpoint.objects.get(pk=endpoint.pk)
    if endpoint.routing_policy != policy:
        endpoint = endpoint_set_routing(actor=bench.user, endpoint=endpoint, routing_policy=policy)
        time.sleep(settings.PROXY_ROUTE_CACHE_S + 1)  # every web process routes by it from now on
    return endpoint


def line(label: str, report: dict[str, Any], extra: str = "") -> str:
    return (
        f"  {label:<11} requests {report['requests']:>4}  errors {report['errors']:>3}  "
        f"TTFT p50 {report['ttft_ms_p50'] or 0:7.0f} ms  p99 {report['ttft_ms_p99'] or 0:7.0f} ms  "
        f"ITL p50 {report['itl_ms_p50'] or 0:5.0f} ms  {report['output_tokens_per_s'] or 0:6.1f} tok/s  "
        f"prompt {report['prompt_tokens_mean'] or 0:6.0f} tok{extra}"
    )


def multiturn(
    bench: Bench, endpoint: Any, ports: list[int], args: argparse.Namespace, title: str, seed: int
) -> list[str]:
    lines = [f"{title} ({load()}):"]
    results: dict[str, dict[str, Any]] = {}
    for n, policy in enumerate(args.policies):
        set_policy(bench, endpoint, policy)
        spec = loadgen.LoadSpec(
            model=MODEL,
            concurrency=16,
            prompt_tokens=118,
            output_tokens=32,
            duration_s=3600,
            turns=6,
            system_tokens=1500,
            conversations=16,
            session_header=True,
            think_s=args.think_s,
            seed=seed + n,
        )
        before, routed_before = cache_counters(ports), routed_counts(endpoint)
        report = run_load(bench.plane.url, bench.headers_for(endpoint), spec)
        time.sleep(1.5)  # (the web processes publish their counts every second)
        after, routed_after = cache_counters(ports), routed_counts(endpoint)
        queried = after[1] - before[1]
        report["cache_hit_rate"] = (after[0] - before[0]) / queried if queried else None
        report["uncached_prompt_tokens"] = (queried - (after[0] - before[0])) / max(1, report["requests"])
        label = policy if policy not in results else f"{policy}#{n}"  # a policy run again: the noise control
        results[label] = report
        rate = report["cache_hit_rate"]
        hit = f"  cache hits {rate:.2f}" if rate is not None else "  cache hits n/a"
        hit += f"  uncached {report['uncached_prompt_tokens']:.0f} tok/req"
        hit += routed_line(routed_before, routed_after)
        lines.append(line(label, report, hit))
        print(lines[-1], flush=True)
    base = results.get("least_load")
    for policy in [p for p in results if p != "least_load"]:
        if base is None:
            continue
        ttft = results[policy]["ttft_ms_p50"] / base["ttft_ms_p50"]
        tput = results[policy]["output_tokens_per_s"] / base["output_tokens_per_s"]
        goal = f"goal ≤ 0.6x and ≥ 1.3x: {verdict(ttft <= 0.6 and tput >= 1.3)}" if args.goal_line(title) else ""
        lines.append(f"  {policy} / least_load: TTFT p50 {ttft:.2f}x, throughput {tput:.2f}x  {goal}")
    return lines


def uniform(bench: Bench, endpoint: Any, args: argparse.Namespace) -> list[str]:
    lines = [f"uniform random prompts (8 clients, 400 words in, 32 tokens out, {args.uniform_s} s each; {load()}):"]
    results = {}
    for n, policy in enumerate(args.policies):
        set_policy(bench, endpoint, policy)
        spec = loadgen.LoadSpec(
            model=MODEL, concurrency=8, prompt_tokens=400, output_tokens=32, duration_s=args.uniform_s, seed=900 + n
        )
        label = policy if policy not in results else f"{policy}#{n}"
        results[label] = run_load(bench.plane.url, bench.headers_for(endpoint), spec)
        lines.append(line(label, results[label]))
        print(lines[-1], flush=True)
    base = results.get("least_load")
    for policy in [p for p in results if p != "least_load"]:
        if base is None:
            continue
        tput = results[policy]["output_tokens_per_s"] / base["output_tokens_per_s"]
        ttft = results[policy]["ttft_ms_p50"] / base["ttft_ms_p50"]
        ok = tput >= 0.95 and ttft <= 1.05
        lines.append(
            f"  {policy} / least_load: throughput {tput:.2f}x, TTFT p50 {ttft:.2f}x  goal within 5 %: {verdict(ok)}"
        )
    return lines


def overload(bench: Bench, endpoint: Any, args: argparse.Namespace) -> list[str]:
    set_policy(bench, endpoint, "least_load")
    spec = loadgen.LoadSpec(
        model=MODEL, concurrency=32, prompt_tokens=200, output_tokens=32, duration_s=args.overload_s, seed=1700
    )
    report = run_load(bench.plane.url, bench.headers_for(endpoint), spec)
    answered_or_429 = report["succeeded"] + report["rate_limited_with_retry_after"] == report["requests"]
    waits = queue_wait_figures(endpoint)
    return [
        f"overload: 32 clients = 2x capacity (2 replicas x --max-num-seqs 8), {args.overload_s} s, least_load "
        f"({load()}):",
        line("least_load", report),
        f"  5xx {report['server_errors']}, 429 {report['rate_limited']} (with Retry-After "
        f"{report['rate_limited_with_retry_after']}), other errors {report['errors_by_kind']}",
        f"  goal zero 5xx: {verdict(report['server_errors'] == 0)}; every request answered or 429 + Retry-After: "
        f"{verdict(answered_or_429)}",
        f"  queue wait: {waits or 'not reported (nothing admitted in the last window)'}",
    ]


def agents() -> dict[int, set[int]]:
    """This bench's agent processes (not the servers they started) → the cores they may run on."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = stat.read_bytes().split(b"\0")
            pid = int(stat.parent.name)
            if b"agent" in argv and b"run" in argv and os.getppid() != pid and _ours(pid):
                found[pid] = os.sched_getaffinity(pid)
        except (OSError, ValueError):
            continue
    return found


def _ours(pid: int) -> bool:
    """Whether `pid` descends from this process."""
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid == os.getpid():
            return True
    return False


def set_agents_affinity(cores: dict[int, set[int]]) -> None:
    """Run each agent's own threads (its servers keep theirs) on `cores[pid]`."""
    for pid, allowed in cores.items():
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(task.name), allowed)


def overhead(bench: Bench, endpoint: Any, ports: list[int], args: argparse.Namespace) -> list[str]:
    lines = overhead_once(bench, endpoint, ports, args, "")
    if args.agents_anywhere:
        pinned = agents()
        set_agents_affinity({pid: set(range(os.cpu_count() or 1)) for pid in pinned})
        try:
            how = f", {len(pinned)} agents on any core (their servers pinned)"
            lines += overhead_once(bench, endpoint, ports, args, how)
        finally:
            set_agents_affinity(pinned)
    return lines


def overhead_once(bench: Bench, endpoint: Any, ports: list[int], args: argparse.Namespace, how: str) -> list[str]:
    set_policy(bench, endpoint, "least_load")
    base = {"model": MODEL, "concurrency": 1, "prompt_tokens": 64, "output_tokens": 4, "duration_s": 3600}
    proxied: list[float] = []
    direct: list[float] = []
    for n in range(args.overhead_n):
        for url, headers, into in (
            (bench.plane.url, bench.headers_for(endpoint), proxied),
            (f"http://127.0.0.1:{ports[n % len(ports)]}", {}, direct),
        ):
            spec = loadgen.LoadSpec(**base, conversations=1, seed=3000 + 2 * n + len(into))
            outcomes, _ = asyncio.run(loadgen.run(url, headers, spec))
            into.extend(o.ttft for o in outcomes if o.ttft is not None and not o.error)
    # the proxy spreads over both replicas (least load): the direct column alternates between them too
    p_proxy, p_direct = loadgen.pct(proxied, 0.5) * 1000, loadgen.pct(direct, 0.5) * 1000
    return [
        f"overhead: 1 request at a time, {args.overhead_n} each, alternating{how} ({load()}):",
        f"  TTFT p50 through the proxy {p_proxy:.1f} ms, straight to a replica {p_direct:.1f} ms: "
        f"+{p_proxy - p_direct:.1f} ms; goal ≤ 5 ms: {verdict(p_proxy - p_direct <= 5)}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    phases = ("multiturn", "uniform", "overload", "overhead", "ample")
    parser.add_argument("--phases", nargs="+", choices=phases, default=list(phases))
    parser.add_argument(
        "--policies",
        nargs="+",
        choices=POLICIES,
        default=list(POLICIES),
        help="in this order; one named again runs again (least_load twice: how far two runs of one policy differ)",
    )
    parser.add_argument("--kv-blocks", type=int, default=72, help="KV cache blocks (of 128 tokens) per replica, small")
    parser.add_argument("--think-s", type=float, default=1.0, help="mean pause between a conversation's turns")
    parser.add_argument("--uniform-s", type=int, default=40)
    parser.add_argument("--overload-s", type=int, default=40)
    parser.add_argument("--overhead-n", type=int, default=20)
    parser.add_argument(
        "--agents-anywhere",
        action="store_true",
        help="overhead: measure again with the agents' own threads free to run on any core (servers stay pinned)",
    )
    parser.add_argument(
        "--web-env",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="settings of the control plane's processes (e.g. PROXY_KEEP_WARM_S=0: keys and routes read on demand)",
    )
    parser.add_argument(
        "--engine",
        choices=("vllm", "standin"),
        default="vllm",
        help="standin: the OpenAI stand-in instead of vLLM (quick; only the overhead phase means anything)",
    )
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    args.goal_line = lambda title: title.startswith("multi-turn, small")
    log_dir = Path(tempfile.mkdtemp(prefix="bench-routing-"))
    web_env = dict(item.split("=", 1) for item in args.web_env)
    engine = "vLLM CPU" if args.engine == "vllm" else "the OpenAI stand-in"
    changed = f"; web settings {' '.join(args.web_env)}" if web_env else ""
    report = [f"{engine}, 2 replicas on 2 pinned agents{changed}; logs in {log_dir}; {load()}"]
    started = time.monotonic()
    try:
        with setup(args.engine, log_dir, pin_nodes=True, model=build_timing_llama, web_env=web_env) as bench:
            small = [*SERVER_ARGS, "--num-gpu-blocks-override", str(args.kv_blocks)]
            if set(args.phases) & {"multiturn", "uniform", "overload", "overhead"}:
                endpoint, ports = start_endpoint(bench, small)
                title = (
                    f"multi-turn, small KV cache ({args.kv_blocks * 128} tokens per replica), 16 x 6 turns, "
                    f"think {args.think_s} s"
                )
                steps = {
                    "multiturn": lambda: multiturn(bench, endpoint, ports, args, title, 100),
                    "uniform": lambda: uniform(bench, endpoint, args),
                    "overload": lambda: overload(bench, endpoint, args),
                    "overhead": lambda: overhead(bench, endpoint, ports, args),
                }
                for name, step in steps.items():
                    if name in args.phases:
                        lines = step()
                        print("\n".join(lines), flush=True)
                        report += lines
                stop_endpoint(bench, endpoint)
            if "ample" in args.phases:
                endpoint, ports = start_endpoint(bench, SERVER_ARGS)
                lines = multiturn(
                    bench,
                    endpoint,
                    ports,
                    args,
                    f"multi-turn, ample KV cache (87,296 tokens), 16 x 6 turns, think {args.think_s} s",
                    500,
                )
                print("\n".join(lines), flush=True)
                report += lines
                stop_endpoint(bench, endpoint)
    finally:
        print(f"\n== summary ({time.monotonic() - started:.0f} s)\n" + "\n".join(report))
    shutil.rmtree(log_dir, ignore_errors=True)


if __name__ == "__main__":
    main()

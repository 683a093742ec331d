"""What API-key authentication adds to a request on the endpoint proxy path, side by side in one run.

    .venv/bin/python bench/key_auth.py                # 3,000 requests per column
    .venv/bin/python bench/key_auth.py --requests 10000

Sets up the benchmark's own database and redis-server, one endpoint on an offline node (the proxy
resolves, authenticates, admits and answers 502 without a tunnel: everything up to forwarding), and
drives the project's ASGI application in this process (no network, no client in the figures), the
columns interleaved request by request:
- public: a public endpoint, no credentials (the baseline);
- key: a private endpoint, `Authorization: Bearer <key>` with the invoke scope;
- key + limits: the same with requests/min and tokens/min limits set (one Redis round trip each).
Caches run as in production (routes 2 s, keys API_KEY_CACHE_S), so their reloads are in the figures.
Printed: p50/p95/p99 per column, the p95 each key column adds to public, and PASS/MISS against 1 ms,
with the machine's load average (the limits column waits on redis-server, another process: on a
loaded machine its tail is the scheduler's).
The database is dropped and the redis-server stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("BENCH_DB", "cleverthis_bench_key_auth")

from proxy import drop_database, prepare_database, start_redis  # noqa: E402  (django.setup())

GOAL_MS = 1.0
COLUMNS = ("public", "key", "key + limits")


def setup() -> dict[str, tuple[str, str]]:
    """(host, Authorization) per column."""
    from agent import protocol  # noqa: F401
    from fleet import origin_names, services
    from fleet.workloads import services as workload_services
    from tests.fleet.conftest import facts_dict, make_csr_pem, make_key
    from tests.support.endpoints import endpoint_row

    user, cluster = prepare_database()
    _, raw = services.join_token_create(cluster=cluster, actor=user)
    node, _ = services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts_dict("bench"))
    public = endpoint_row(cluster=cluster, node=node, model_id="m", status="running", port=9, public=True)
    private = endpoint_row(cluster=cluster, node=node, model_id="m", status="running", port=9)
    workspace = cluster.workspace
    _, plain = workload_services.api_key_create(actor=user, workspace=workspace, name="plain", scopes=["invoke"])
    _, limited = workload_services.api_key_create(
        actor=user, workspace=workspace, name="limited", scopes=["invoke"], requests_per_min=10**9, tokens_per_min=10**9
    )
    return {
        "public": (origin_names.ENDPOINT.host(public.slug), ""),
        "key": (origin_names.ENDPOINT.host(private.slug), f"Bearer {plain}"),
        "key + limits": (origin_names.ENDPOINT.host(private.slug), f"Bearer {limited}"),
    }


async def one(app, host: str, authorization: str) -> float:
    headers = [(b"host", host.encode()), (b"content-type", b"application/json")]
    if authorization:
        headers.append((b"authorization", authorization.encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    status: list[int] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    start = time.perf_counter()
    await app(scope, receive, send)
    elapsed = time.perf_counter() - start
    if status != [502]:
        raise RuntimeError(f"expected the proxy's 502 (offline node), got {status}")
    return elapsed


async def measure(columns: dict[str, tuple[str, str]], requests: int) -> dict[str, list[float]]:
    from cleverthis.asgi import application

    times: dict[str, list[float]] = {name: [] for name in COLUMNS}
    for name in COLUMNS:  # warm up: caches, connections, the Lua script
        for _ in range(50):
            await one(application, *columns[name])
    for i in range(requests):
        for k in range(len(COLUMNS)):
            name = COLUMNS[(i + k) % len(COLUMNS)]
            times[name].append(await one(application, *columns[name]))
    return times


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=3000, help="requests per column")
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-key-auth-"))
    redis = start_redis(log_dir)
    try:
        columns = setup()
        times = asyncio.run(measure(columns, args.requests))
    finally:
        from fleet.usage import meter

        meter.discard()  # the usage the requests noted: not to be written to the database dropped next
        redis.stop()
        drop_database()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{args.requests} requests per column, interleaved; ms per request through the proxy app (load {load})")
    print(f"{'column':<14}{'p50':>8}{'p95':>8}{'p99':>8}{'added p95':>11}")
    base = pct(times["public"], 0.95)
    verdicts = []
    for name in COLUMNS:
        p95 = pct(times[name], 0.95)
        added = p95 - base
        print(f"{name:<14}{pct(times[name], 0.5):>8.3f}{p95:>8.3f}{pct(times[name], 0.99):>8.3f}{added:>11.3f}")
        if name != "public":
            verdicts.append((name, added))
    for name, added in verdicts:
        print(f"goal: {name} adds < {GOAL_MS} ms p95: {added:.3f} ms {'PASS' if added < GOAL_MS else 'MISS'}")


if __name__ == "__main__":
    main()

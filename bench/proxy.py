"""Proxy benchmark: direct vs through the tunnel, side by side in one run.

    .venv/bin/python bench/proxy.py
    .venv/bin/python bench/proxy.py --requests 500 --concurrency 8 --big-mb 100

Sets up, on this machine: PostgreSQL + Redis (running), a real daphne, a real agent process joined to
it, and an HTTP server on the "node" side. Then measures the same workloads against the server directly
and through the control plane (`/endpoints/<slug>/…` → tunnel → agent → server):
- small requests: requests/s and p50/p99 latency at a fixed concurrency;
- one large body (default 100 MB): MB/s;
- heartbeat round trips reported by the agent while the large transfer runs, against idle.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleverthis.settings.base")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/14")
BENCH_DB = os.environ.get("BENCH_DB", "cleverthis_bench_proxy")
os.environ["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{BENCH_DB}"

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from tests.support.live import agent_join, agent_run  # noqa: E402
from tests.support.processes import daphne, free_port, port_open, wait_until  # noqa: E402

SMALL = b'{"ok": true}'


class Node(BaseHTTPRequestHandler):
    """The service on the node: a tiny JSON answer, or N megabytes."""

    protocol_version = "HTTP/1.1"
    big = b""

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        body = self.big if self.path.startswith("/big") else SMALL
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        view = memoryview(body)
        for offset in range(0, len(view), 1 << 20):
            self.wfile.write(view[offset : offset + (1 << 20)])


async def fetch(host: str, port: int, path: str, *, host_header: str = "node") -> int:
    """One HTTP/1.1 GET on a fresh connection; returns the body size."""
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 22)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host_header}\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    match = re.search(rb"(?i)content-length:\s*(\d+)", head)
    status = int(head.split(b" ", 2)[1])
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {head!r}")
    size = 0
    if match:
        remaining = int(match.group(1))
        while remaining:
            chunk = await reader.read(min(remaining, 1 << 20))
            if not chunk:
                raise RuntimeError("connection closed early")
            size += len(chunk)
            remaining -= len(chunk)
    else:
        while chunk := await reader.read(1 << 20):
            size += len(chunk)
    writer.close()
    return size


async def small_requests(port: int, path: str, total: int, concurrency: int) -> dict[str, float]:
    latencies: list[float] = []
    queue = list(range(total))

    async def worker() -> None:
        while queue:
            queue.pop()
            started = time.perf_counter()
            await fetch("127.0.0.1", port, path)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    return {
        "rps": total / elapsed,
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[int(0.99 * (len(ordered) - 1))] * 1000,
    }


async def big_transfer(port: int, path: str, expected: int) -> float:
    started = time.perf_counter()
    size = await fetch("127.0.0.1", port, path)
    elapsed = time.perf_counter() - started
    assert size == expected, (size, expected)
    return size / elapsed / 1e6


RTT = re.compile(r"^(\S+ \S+) INFO agent.tunnel heartbeat sent \(last round trip ([\d.]+) ms\)")


def heartbeat_rtts(log: str, start: float, end: float) -> list[float]:
    """Round trips the agent logged between two wall-clock times."""
    import datetime as dt

    values = []
    for line in log.splitlines():
        match = RTT.match(line)
        if match:
            at = dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if start <= at <= end:
                values.append(float(match.group(2)))
    return values


def prepare_database() -> tuple[object, object]:
    import psycopg
    from django.contrib.auth import get_user_model

    from cleverthis.tenancy.services import workspace_create
    from fleet import services

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{BENCH_DB}"')
    connection.close()
    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench", password="x")
    workspace = workspace_create(name="Bench", owner=user)
    return user, services.cluster_create(actor=user, workspace=workspace, name="bench")


def describe(label: str, direct: float, proxied: float, unit: str, higher_is_better: bool = True) -> str:
    ratio = proxied / direct if direct else float("nan")
    better = "proxied/direct" if higher_is_better else "proxied/direct (lower is better)"
    return f"{label:<34} {direct:>12.1f} {proxied:>12.1f}  {unit:<8} {better} = {ratio:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--big-mb", type=int, default=100)
    args = parser.parse_args()

    from fleet import services
    from fleet.models import Endpoint
    from fleet.models import Node as FleetNode

    Node.big = os.urandom(1 << 20) * args.big_mb
    node_port = free_port()
    ThreadingHTTPServer.request_queue_size = 256  # no SYN drops at the benchmark's concurrency
    server = ThreadingHTTPServer(("127.0.0.1", node_port), Node)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    user, cluster = prepare_database()
    env = {
        "DATABASE_URL": os.environ["DATABASE_URL"],
        "REDIS_URL": os.environ["REDIS_URL"],
        "DJANGO_SETTINGS_MODULE": "cleverthis.settings.base",
        "AGENT_HEARTBEAT_INTERVAL_S": "0.2",
        "DEBUG": "0",
        "LOG_LEVEL": "WARNING",
        "PROXY_MAX_BODY_BYTES": str(1 << 30),
    }
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp:
        tmp_path = Path(tmp)
        web_port = free_port()
        web = daphne(tmp_path, web_port, env=env)
        agent = None
        try:
            wait_until(lambda: port_open(web_port), timeout=30, what="daphne")
            _, raw = services.join_token_create(cluster=cluster, actor=user)
            joined = agent_join(f"http://127.0.0.1:{web_port}", raw, tmp_path / "state")
            assert joined.returncode == 0, joined.stderr
            agent = agent_run(tmp_path / "state", tmp_path, env={"CLEVERTHIS_PROXY_PORTS": str(node_port)})
            wait_until(lambda: FleetNode.objects.filter(connected=True).exists(), timeout=30, what="agent")
            time.sleep(1.5)  # let the agent's first inventory report land (it reconciles endpoints)
            node = FleetNode.objects.get()
            endpoint = Endpoint.objects.create(
                cluster=cluster, node=node, model_id="bench/m", status="running", port=node_port, public=True
            )
            proxied_prefix = f"/endpoints/{endpoint.slug}"

            async def run() -> dict[str, object]:
                results: dict[str, object] = {}
                await small_requests(node_port, "/small", 50, args.concurrency)  # warm up
                await small_requests(web_port, proxied_prefix + "/small", 50, args.concurrency)
                results["direct_small"] = await small_requests(node_port, "/small", args.requests, args.concurrency)
                results["proxied_small"] = await small_requests(
                    web_port, proxied_prefix + "/small", args.requests, args.concurrency
                )
                expected = len(Node.big)
                results["direct_big"] = await big_transfer(node_port, "/big", expected)
                idle_start = time.time()
                await asyncio.sleep(3)
                results["idle_window"] = (idle_start, time.time())
                big_start = time.time()
                results["proxied_big"] = await big_transfer(web_port, proxied_prefix + "/big", expected)
                results["big_window"] = (big_start, time.time())
                return results

            results = asyncio.run(run())
            time.sleep(0.5)
            log = agent.log()
        finally:
            if agent is not None:
                agent.stop()
            web.stop()
            server.shutdown()

    idle = heartbeat_rtts(log, *results["idle_window"])
    during = heartbeat_rtts(log, *results["big_window"])
    ds, ps = results["direct_small"], results["proxied_small"]
    print(f"\nsmall GETs: {args.requests} at concurrency {args.concurrency}; large body: {args.big_mb} MB")
    print(f"{'':<34} {'direct':>12} {'proxied':>12}")
    print(describe("small requests/s", ds["rps"], ps["rps"], "req/s"))
    print(describe("small p50 latency", ds["p50_ms"], ps["p50_ms"], "ms", False))
    print(describe("small p99 latency", ds["p99_ms"], ps["p99_ms"], "ms", False))
    print(describe(f"{args.big_mb} MB body throughput", results["direct_big"], results["proxied_big"], "MB/s"))

    def pct(values: list[float], q: float) -> float:
        return sorted(values)[int(q * (len(values) - 1))] if values else float("nan")

    print(
        f"\nheartbeat round trip (agent-measured, every 0.2 s): idle p50 {pct(idle, 0.5):.1f} ms / p99 "
        f"{pct(idle, 0.99):.1f} ms ({len(idle)} samples); during the {args.big_mb} MB transfer p50 "
        f"{pct(during, 0.5):.1f} ms / p99 {pct(during, 0.99):.1f} ms ({len(during)} samples)"
    )


if __name__ == "__main__":
    main()

"""Proxy benchmark: direct vs through the tunnel, side by side in one run.

    .venv/bin/python bench/proxy.py
    .venv/bin/python bench/proxy.py --requests 500 --concurrency 8 --big-mb 100

Sets up, on this machine: PostgreSQL (running), a private redis-server, one web replica under the
chosen ASGI server (`--server`, default uvicorn, the production server; `--workers` processes), a
real agent process joined to it, and an HTTP server on the "node" side. Then measures the same
workloads against the server directly and through the control plane
(`endpoint-<slug>.<ENDPOINT_DOMAIN>` → tunnel → agent → server):
- small requests: requests/s and p50/p99 latency at a fixed concurrency;
- one large body (default 100 MB), repeated for a few seconds: median MB/s, and the CPU seconds each
  process spent per GB moved (the benchmark's own client and node server, the web replicas, the agent);
- heartbeat round trips reported by the agent while the large transfers run, against idle;
- the same through a second replica that does not hold the tunnel (over a peer link to the first).

The benchmark's database is dropped at the end, and every process it started is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import secrets
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleverthis.settings.base")
# DEBUG is off, as in production: a secret key of this run's own (the web processes it starts inherit it)
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))

from tests.support.processes import ManagedProcess, free_port, port_open, wait_until  # noqa: E402

# A redis-server of the benchmark's own (started by `start_redis`): the shared one is never touched, and
# the CPU it spends carrying the other replica's stream bytes is this benchmark's alone.
REDIS_PORT = free_port()
os.environ["REDIS_URL"] = f"redis://127.0.0.1:{REDIS_PORT}/0"
BENCH_DB = os.environ.get("BENCH_DB", "cleverthis_bench_proxy")
os.environ["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{BENCH_DB}"

import django  # noqa: E402

django.setup()

import web_servers  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from tests.support.live import agent_join, agent_run  # noqa: E402

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


async def small_requests(
    port: int, path: str, total: int, concurrency: int, *, host: str = "node"
) -> tuple[list[float], float]:
    """`total` GETs on fresh connections, `concurrency` at a time: (latencies, elapsed seconds)."""
    latencies: list[float] = []
    queue = list(range(total))

    async def worker() -> None:
        while queue:
            queue.pop()
            started = time.perf_counter()
            await fetch("127.0.0.1", port, path, host_header=host)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - started


def summarize_small(rounds: list[tuple[list[float], float]]) -> dict[str, float]:
    latencies = sorted(value for round_latencies, _ in rounds for value in round_latencies)
    return {
        "rps": len(latencies) / sum(elapsed for _, elapsed in rounds),
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(0.99 * (len(latencies) - 1))] * 1000,
    }


async def big_transfer(port: int, path: str, expected: int, *, host: str = "node") -> float:
    started = time.perf_counter()
    size = await fetch("127.0.0.1", port, path, host_header=host)
    elapsed = time.perf_counter() - started
    assert size == expected, (size, expected)
    return size / elapsed / 1e6


def cpu_seconds(pids: dict[str, list[int]]) -> dict[str, float]:
    """User + system CPU seconds used so far by the processes of each role."""
    import psutil

    used = {}
    for role, role_pids in pids.items():
        used[role] = sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in role_pids)
    return used


async def big_transfers(
    port: int, path: str, expected: int, min_seconds: float, pids: dict[str, list[int]], *, host: str = "node"
) -> dict[str, object]:
    """Repeat the large transfer for at least `min_seconds`: median MB/s and CPU seconds per GB per process."""
    rates = []
    before = cpu_seconds(pids)
    started = time.perf_counter()
    while not rates or time.perf_counter() - started < min_seconds:
        rates.append(await big_transfer(port, path, expected, host=host))
    after = cpu_seconds(pids)
    gigabytes = len(rates) * expected / 1e9
    return {
        "mb_s": statistics.median(rates),
        "transfers": len(rates),
        "cpu_s_per_gb": {role: (after[role] - before[role]) / gigabytes for role in pids},
    }


def start_redis(log_dir: Path) -> ManagedProcess:
    """The benchmark's own redis-server on REDIS_PORT (the channel layer of its replicas)."""
    import shutil

    argv = [shutil.which("redis-server") or "redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1"]
    argv += ["--save", "", "--appendonly", "no", "--maxclients", "30000", "--tcp-backlog", "4096"]
    redis = ManagedProcess("redis", argv, log_dir=log_dir)
    wait_until(lambda: port_open(REDIS_PORT), timeout=10, what="redis")
    return redis


def bench_setting(
    stack: contextlib.ExitStack, keep: str | None, prefix: str
) -> tuple[Path, ManagedProcess, object, object]:
    """What the proxy benches set up alike, each part undone when `stack` closes: their folder (`keep`, whose
    logs stay, or a temporary one named `prefix`...), the private Redis logging there, and the bench database
    (`prepare_database`: its user and compute cluster). Returns (folder, redis, user, cluster)."""
    if keep:
        folder = Path(keep)
        folder.mkdir(parents=True, exist_ok=True)
    else:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
    redis = start_redis(folder)
    stack.callback(redis.stop)
    stack.callback(drop_database)
    user, cluster = prepare_database()
    return folder, redis, user, cluster


def pids_roles(big: dict[str, dict[str, object]]) -> list[str]:
    return list(next(iter(big.values()))["cpu_s_per_gb"])


def run_relay(listen_port: int, target_port: int) -> None:
    """A bare byte relay (asyncio, no framing, no parsing): one hop of the ceiling column."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 18):
            writer.write(data)
            await writer.drain()
        writer.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port, limit=1 << 20)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", listen_port, limit=1 << 20, backlog=256)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


def start_relays(node_port: int) -> tuple[int, list[object]]:
    """Two bare relays in their own processes, chained in front of the node server: (entry port, procs)."""
    import subprocess

    inner, outer = free_port(), free_port()
    procs = [
        subprocess.Popen([sys.executable, __file__, "--relay", str(inner), str(node_port)]),
        subprocess.Popen([sys.executable, __file__, "--relay", str(outer), str(inner)]),
    ]
    wait_until(lambda: port_open(inner) and port_open(outer), timeout=30, what="relays")
    return outer, procs


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


def control_plane_env(**extra: str) -> dict[str, str]:
    """Environment of the benchmark's web replicas and agent: its database and Redis, quiet logs, a heartbeat
    every 0.2 s (round trips to sample), and registration unthrottled."""
    return {
        "DATABASE_URL": os.environ["DATABASE_URL"],
        "REDIS_URL": os.environ["REDIS_URL"],
        "DJANGO_SETTINGS_MODULE": "cleverthis.settings.base",
        "AGENT_HEARTBEAT_INTERVAL_S": "0.2",
        "DEBUG": "0",
        "AGENT_REGISTER_RATE": "100000/s",  # the benchmark registers nodes in bulk
        "LOG_LEVEL": "WARNING",
        **extra,
    }


def drop_database() -> None:
    """Drop the benchmark's database (its connections closed first)."""
    import psycopg
    from django.db import connections

    connections.close_all()
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')


def prepare_database() -> tuple[object, object]:
    import psycopg
    from django.contrib.auth import get_user_model

    from fleet import services
    from tenancy.services import workspace_create

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{BENCH_DB}"')
    connection.close()
    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench", password="x")
    workspace = workspace_create(name="Bench", owner=user)
    return user, services.cluster_create(actor=user, workspace=workspace, name="bench")


async def profile_proxied(directory: str, processes: dict[str, int], targets: dict[str, tuple[int, str]]) -> None:
    """Raw py-spy stacks of `processes` while big transfers, then small requests, repeat (--profile)."""
    import subprocess

    Path(directory).mkdir(parents=True, exist_ok=True)
    for target, (port, host) in targets.items():
        for phase in ("big", "small"):
            profilers = [
                subprocess.Popen(
                    [
                        str(Path(sys.executable).parent / "py-spy"),
                        "record",
                        "-d",
                        "8",
                        "-r",
                        "200",
                        "-p",
                        str(pid),
                        "--format",
                        "raw",
                        "--nonblocking",
                        "--subprocesses",
                        "-o",
                        str(Path(directory) / f"{target}-{phase}-{role}.txt"),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for role, pid in processes.items()
            ]
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                if phase == "big":
                    await big_transfer(port, "/big", len(Node.big), host=host)
                else:
                    await small_requests(port, "/small", 100, 8, host=host)
            for profiler in profilers:
                await asyncio.to_thread(profiler.wait)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", choices=web_servers.SERVERS, default="uvicorn", help="the ASGI server")
    parser.add_argument("--workers", type=int, default=1, help="web processes per replica")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--big-mb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds of small requests")
    parser.add_argument(
        "--big-seconds", type=float, default=3.0, help="repeat each large transfer for at least this long"
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="after measuring, repeat the proxied workloads (through each replica) under py-spy and write "
        "collapsed stacks of both replicas and the agent into DIR (needs py-spy)",
    )
    args = parser.parse_args()

    from fleet import services
    from fleet.models import Node as FleetNode
    from tests.support.endpoints import endpoint_row

    Node.big = os.urandom(1 << 20) * args.big_mb
    node_port = free_port()
    ThreadingHTTPServer.request_queue_size = 256  # no SYN drops at the benchmark's concurrency
    server = ThreadingHTTPServer(("127.0.0.1", node_port), Node)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    env = control_plane_env(PROXY_MAX_BODY_BYTES=str(1 << 30))
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp:
        tmp_path = Path(tmp)
        redis = start_redis(tmp_path)
        web_port = free_port()
        web = agent = None
        try:
            user, cluster = prepare_database()
            web = web_servers.start(tmp_path, web_port, server=args.server, workers=args.workers, env=env, name="web")
            wait_until(lambda: port_open(web_port), timeout=30, what=args.server)
            _, raw = services.join_token_create(cluster=cluster, actor=user)
            joined = agent_join(f"http://127.0.0.1:{web_port}", raw, tmp_path / "state")
            assert joined.returncode == 0, joined.stderr
            agent = agent_run(tmp_path / "state", tmp_path, env={"CLEVERTHIS_PROXY_PORTS": str(node_port)})
            wait_until(lambda: FleetNode.objects.filter(connected=True).exists(), timeout=30, what="agent")
            time.sleep(1.5)  # let the agent's first inventory report land (it reconciles endpoints)
            node = FleetNode.objects.get()
            endpoint = endpoint_row(
                cluster=cluster, node=node, model_id="bench/m", status="running", port=node_port, public=True
            )
            origin = endpoint.hostname  # node content is proxied on its own origin only

            relay_port, relays = start_relays(node_port)
            # a second replica, started after the agent connected to the first: its requests reach the
            # tunnel over a peer link to the first, as most requests do when several replicas run
            other_port = free_port()
            other = web_servers.start(
                tmp_path, other_port, server=args.server, workers=args.workers, env=env, name="web-other"
            )
            wait_until(lambda: port_open(other_port), timeout=30, what=f"second {args.server}")
            targets = {
                "direct": (node_port, "node"),
                "2 bare relays": (relay_port, "node"),
                "proxied": (web_port, origin),
                "other replica": (other_port, origin),
            }
            pids = {
                "bench (client+server)": [os.getpid()],
                "bare relays": [relay.pid for relay in relays],
                f"{args.server} (tunnel)": [proc.pid for proc in web_servers.tree(web.popen.pid)],
                f"{args.server} (other)": [proc.pid for proc in web_servers.tree(other.popen.pid)],
                "agent": [agent.popen.pid],
                "redis": [redis.popen.pid],
            }

            async def run() -> dict[str, object]:
                results: dict[str, object] = {}
                for port, host in targets.values():  # warm up
                    await small_requests(port, "/small", 50, args.concurrency, host=host)
                rounds: dict[str, list[tuple[list[float], float]]] = {label: [] for label in targets}
                for _ in range(args.rounds):  # interleaved, so a busy moment of the machine hits all three
                    for label, (port, host) in targets.items():
                        per_round = max(1, args.requests // args.rounds)
                        rounds[label].append(
                            await small_requests(port, "/small", per_round, args.concurrency, host=host)
                        )
                results["small"] = {label: summarize_small(rounds[label]) for label in targets}
                expected = len(Node.big)
                results["big"] = {}
                for label, (port, host) in targets.items():
                    if label == "proxied":
                        idle_start = time.time()
                        await asyncio.sleep(3)
                        results["idle_window"] = (idle_start, time.time())
                        big_start = time.time()
                    results["big"][label] = await big_transfers(
                        port, "/big", expected, args.big_seconds, pids, host=host
                    )
                    if label == "proxied":
                        results["big_window"] = (big_start, time.time())
                if args.profile:
                    processes = {"web": web.popen.pid, "other": other.popen.pid, "agent": agent.popen.pid}
                    await profile_proxied(
                        args.profile,
                        processes,
                        {"local": (web_port, origin), "remote": (other_port, origin)},
                    )
                return results

            results = asyncio.run(run())
            time.sleep(0.5)
            log = agent.log()
        finally:
            for relay in locals().get("relays", []):
                relay.kill()
            if "other" in locals():
                other.stop()
            if agent is not None:
                agent.stop()
            if web is not None:
                web.stop()
            server.shutdown()
            redis.stop()
            drop_database()

    idle = heartbeat_rtts(log, *results["idle_window"])
    during = heartbeat_rtts(log, *results["big_window"])
    small, big = results["small"], results["big"]
    labels = list(small)
    print(
        f"\nsmall GETs: {args.requests} per target in {args.rounds} interleaved rounds at concurrency "
        f"{args.concurrency}; large body: {args.big_mb} MB, repeated for {args.big_seconds:g} s per target"
    )
    print(f"{'':<30}" + "".join(f"{label:>15}" for label in labels) + "  proxied/direct proxied/relays other/direct")

    def row(name: str, values: list[float], unit: str) -> None:
        direct, relays, proxied, other = values
        print(
            f"{name:<30}"
            + "".join(f"{value:>15.1f}" for value in values)
            + f"  {proxied / direct:>14.2f} {proxied / relays:>14.2f} {other / direct:>12.2f}   {unit}"
        )

    row("small requests/s", [small[label]["rps"] for label in labels], "req/s")
    row("small p50 latency", [small[label]["p50_ms"] for label in labels], "ms (lower is better)")
    row("small p99 latency", [small[label]["p99_ms"] for label in labels], "ms (lower is better)")
    row(f"{args.big_mb} MB body (median)", [big[label]["mb_s"] for label in labels], "MB/s")
    row("  CPU s per GB, all processes", [sum(big[label]["cpu_s_per_gb"].values()) for label in labels], "s/GB")
    print("  of which (s/GB):")
    for role in pids_roles(big):
        print(f"    {role:<26}" + "".join(f"{big[label]['cpu_s_per_gb'][role]:>15.2f}" for label in labels))

    def pct(values: list[float], q: float) -> float:
        return sorted(values)[int(q * (len(values) - 1))] if values else float("nan")

    print(
        f"\nheartbeat round trip (agent-measured, every 0.2 s): idle p50 {pct(idle, 0.5):.1f} ms / p99 "
        f"{pct(idle, 0.99):.1f} ms ({len(idle)} samples); during the proxied large transfers p50 "
        f"{pct(during, 0.5):.1f} ms / p99 {pct(during, 0.99):.1f} ms ({len(during)} samples)"
    )


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--relay":
        run_relay(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main()

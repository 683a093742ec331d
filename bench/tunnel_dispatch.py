"""Tunnel and dispatch benchmark: N simulated agents against one real daphne + Celery + Redis + PostgreSQL.

    .venv/bin/python bench/tunnel_dispatch.py            # N = 1, 100, 500
    .venv/bin/python bench/tunnel_dispatch.py --sizes 1 50 --heartbeat 2 --samples 20

Each size runs in a fresh database. Agents are the real `agent.transport.tunnel.TunnelClient` (real keys, real
registration over HTTP, real WebSocket tunnels, CA pinning, signed challenges), all in this process
with asyncio; only their executor is simulated (answers at once), so the numbers measure the control
plane's path: service → Celery task → channel layer → consumer → agent → result recorded.

Printed per size: command round trip (one node; dispatch call → `succeeded` visible in the database)
p50/p99, fan-out to All nodes (dispatch → every command succeeded), heartbeats/s held and heartbeat
round-trip p50/p99, and daphne's RSS and CPU per connected agent.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleverthis.settings.base")
# DEBUG is off, as in production: a secret key of this run's own (the web processes it starts inherit it)
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/14")
BENCH_DB = os.environ.get("BENCH_DB", "cleverthis_bench")
os.environ["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{BENCH_DB}"

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from sim_agents import InstantRunner  # noqa: E402

from agent import protocol as p  # noqa: E402
from agent.config import AgentConfig  # noqa: E402
from agent.registration import join  # noqa: E402
from agent.transport.tunnel import ReconnectPolicy, TunnelClient  # noqa: E402
from tests.support.processes import ManagedProcess, celery_worker, daphne, free_port, port_open, wait_until  # noqa: E402


def reset_database() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{BENCH_DB}"')
    connection.close()
    call_command("migrate", verbosity=0)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def run_size(n: int, args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    from asgiref.sync import sync_to_async
    from django.contrib.auth import get_user_model

    from fleet import services
    from fleet.models import Command, Node
    from tenancy.services import workspace_create

    await sync_to_async(reset_database)()
    user = await sync_to_async(get_user_model().objects.create_user)("bench", password="x")
    workspace = await sync_to_async(workspace_create)(name="Bench", owner=user)
    cluster = await sync_to_async(services.cluster_create)(actor=user, workspace=workspace, name="bench")

    env = {
        "DATABASE_URL": os.environ["DATABASE_URL"],
        "REDIS_URL": os.environ["REDIS_URL"],
        "DJANGO_SETTINGS_MODULE": "cleverthis.settings.base",
        "AGENT_HEARTBEAT_INTERVAL_S": str(args.heartbeat),
        "DEBUG": "0",
        "AGENT_REGISTER_RATE": "100000/s",  # the benchmark registers nodes in bulk
        "LOG_LEVEL": "WARNING",
    }
    port = free_port()
    web: ManagedProcess = daphne(workdir, port, env=env, name=f"daphne-{n}")
    worker = celery_worker(workdir, env=env, name=f"worker-{n}")
    try:
        await asyncio.to_thread(wait_until, lambda: port_open(port), timeout=30, what="daphne")
        url = f"http://127.0.0.1:{port}"
        daphne_proc = psutil.Process(web.popen.pid)
        rss_before = daphne_proc.memory_info().rss
        configs: list[AgentConfig] = []
        for i in range(n):
            _, raw = await sync_to_async(services.join_token_create)(cluster=cluster, actor=user)
            facts = p.HostFacts(hostname=f"sim-{i:04d}", cpu_count=8, memory_total_mb=32768)
            configs.append(
                await asyncio.to_thread(join, url=url, token=raw, state_dir=workdir / f"agent-{n}-{i}", facts=facts)
            )
        clients = [
            TunnelClient(c, lambda mode, settings: InstantRunner(), policy=ReconnectPolicy(base_s=0.5, cap_s=5))
            for c in configs
        ]
        stop = asyncio.Event()
        tasks = [asyncio.ensure_future(c.run(stop)) for c in clients]
        deadline = time.monotonic() + 120
        while sum(c.sessions for c in clients) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        connected = sum(1 for c in clients if c.sessions)
        await asyncio.sleep(args.heartbeat * 1.5)

        # heartbeats held over a window, and daphne's CPU over the same window
        cpu_start = daphne_proc.cpu_times()
        acks_start = sum(len(c.heartbeat_rtts) for c in clients)
        window_start = time.monotonic()
        await asyncio.sleep(args.window)
        elapsed = time.monotonic() - window_start
        cpu_end = daphne_proc.cpu_times()
        acks = sum(len(c.heartbeat_rtts) for c in clients) - acks_start
        rtts = [r for c in clients for r in list(c.heartbeat_rtts)[-5:]]
        cpu_s = (cpu_end.user + cpu_end.system) - (cpu_start.user + cpu_start.system)
        rss_after = daphne_proc.memory_info().rss

        # one-node command round trips
        node = await sync_to_async(lambda: Node.objects.filter(cluster=cluster).order_by("name").first())()
        round_trips = []
        for _ in range(args.samples):
            started = time.monotonic()
            (command,) = await sync_to_async(services.command_dispatch)(
                actor=user, cluster=cluster, command_type="model.download", payload={"model_id": "bench/m"}, node=node
            )
            while not await sync_to_async(Command.objects.filter(pk=command.pk, status="succeeded").exists)():
                await asyncio.sleep(0.002)
            round_trips.append(time.monotonic() - started)

        # fan-out to All nodes
        started = time.monotonic()
        commands = await sync_to_async(services.command_dispatch)(
            actor=user, cluster=cluster, command_type="model.download", payload={"model_id": "bench/all"}
        )
        ids = [c.pk for c in commands]
        while await sync_to_async(Command.objects.filter(pk__in=ids).exclude(status="succeeded").count)() > 0:
            if time.monotonic() - started > 300:
                break
            await asyncio.sleep(0.01)
        fan_out = time.monotonic() - started
        fan_out_done = await sync_to_async(Command.objects.filter(pk__in=ids, status="succeeded").count)()

        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        return {
            "agents": n,
            "connected": connected,
            "rtt_p50_ms": statistics.median(round_trips) * 1000,
            "rtt_p99_ms": percentile(round_trips, 99) * 1000,
            "fanout_s": fan_out,
            "fanout_done": fan_out_done,
            "fanout_targets": len(ids),
            "hb_per_s": acks / elapsed,
            "hb_expected_per_s": connected / args.heartbeat,
            "hb_rtt_p50_ms": statistics.median(rtts) * 1000 if rtts else float("nan"),
            "hb_rtt_p99_ms": percentile(rtts, 99) * 1000 if rtts else float("nan"),
            "rss_per_agent_kib": (rss_after - rss_before) / max(connected, 1) / 1024,
            "cpu_ms_per_agent_per_s": cpu_s / elapsed / max(connected, 1) * 1000,
            "daphne_cpu_percent": cpu_s / elapsed * 100,
        }
    finally:
        web.stop()
        worker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 100, 500])
    parser.add_argument("--heartbeat", type=float, default=5.0, help="heartbeat interval for the run (s)")
    parser.add_argument("--window", type=float, default=15.0, help="heartbeat measurement window (s)")
    parser.add_argument("--samples", type=int, default=30, help="one-node command round trips per size")
    args = parser.parse_args()
    import logging

    logging.basicConfig(level=logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-tunnel-") as tmp:
        for n in args.sizes:
            print(f"running N={n} ...", flush=True)
            rows.append(asyncio.run(run_size(n, args, Path(tmp))))
    print()
    print(f"heartbeat interval {args.heartbeat}s, window {args.window}s, {args.samples} round-trip samples")
    header = (
        "agents connected  rtt p50 ms  rtt p99 ms  fan-out s (done/targets)  hb/s held (expected)  "
        "hb rtt p50/p99 ms  daphne RSS KiB/agent  CPU ms/agent/s"
    )
    print(header)
    for r in rows:
        print(
            f"{r['agents']:>6} {r['connected']:>9}  {r['rtt_p50_ms']:>10.1f}  {r['rtt_p99_ms']:>10.1f}  "
            f"{r['fanout_s']:>9.2f} ({r['fanout_done']}/{r['fanout_targets']})       "
            f"{r['hb_per_s']:>8.1f} ({r['hb_expected_per_s']:.1f})      "
            f"{r['hb_rtt_p50_ms']:>6.1f}/{r['hb_rtt_p99_ms']:<6.1f}    {r['rss_per_agent_kib']:>10.1f}        "
            f"{r['cpu_ms_per_agent_per_s']:.3f}"
        )
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        print(
            f"\nratios N={last['agents']} vs N={first['agents']}: "
            f"rtt p50 x{last['rtt_p50_ms'] / first['rtt_p50_ms']:.2f}, "
            f"fan-out x{last['fanout_s'] / first['fanout_s']:.2f} for x{last['agents'] / first['agents']:.0f} nodes"
        )


if __name__ == "__main__":
    main()

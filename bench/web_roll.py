"""Roll benchmark: N simulated agents behind HAProxy while both web processes are replaced, under load.

    BENCH_DB=cleverthis_roll REDIS_URL=redis://127.0.0.1:6379/14 .venv/bin/python bench/web_roll.py --agents 150

Two uvicorn web processes (one worker each) and a Celery worker on a fresh database, behind a real HAProxy
with the compose stack's backend settings (`tests.support.haproxy`: checks every second, retry-on). N real
`TunnelClient`s (real keys, registration, tunnels; `bench/sim_agents.InstantRunner` answers commands at
once) run in this process and dial HAProxy. Then, as `deploy/compose/roll` does with containers: two new
web processes start, HAProxy checks them in, the two old ones get SIGTERM (they drain: /healthz 503,
tunnels moved make-before-break) and exit by themselves. Meanwhile one command a second goes to a random
node, and the API (/healthz and the Nodes list) is polled through HAProxy twice a second.

Printed: tunnel reconnects per agent (sessions welcomed after the first), seconds each agent was without a
live tunnel (p50 / max of its longest gap, sampled every 0.1 s), node-offline events and the fewest nodes
online, commands sent / succeeded / lost / run twice by one node, API requests answered 2xx, how long
the old processes took to drain, the machine's load, and the issue's goals with PASS or MISS.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("BENCH_DB", "cleverthis_roll")

import tunnel_dispatch as td  # noqa: E402  (django.setup() on the bench database)
from sim_agents import InlineExecutor, InstantRunner  # noqa: E402

from agent import protocol as p  # noqa: E402
from agent.config import AgentConfig  # noqa: E402
from agent.registration import join  # noqa: E402
from agent.transport.tunnel import ReconnectPolicy, TunnelClient  # noqa: E402
from tests.support import haproxy  # noqa: E402
from tests.support.processes import celery_worker, free_port, port_open, wait_until, web_server  # noqa: E402


class CountingRunner(InstantRunner):
    """InstantRunner that counts how often each idempotency key really ran on this node."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: collections.Counter[str] = collections.Counter()

    def run(self, command: p.Command, progress):  # type: ignore[no-untyped-def]
        self.runs[command.idempotency_key] += 1
        return super().run(command, progress)


# The agents' loop runs their blocking calls inline (`InlineExecutor`): the benchmark's own blocking work
# (starting processes, waiting for them) goes to threads of its own, or it would stall every agent.
_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="bench")


async def blocking(fn: Any, *args: Any) -> Any:
    """`fn(*args)` on the benchmark's own threads."""
    return await asyncio.get_running_loop().run_in_executor(_POOL, functools.partial(fn, *args))


def live(client: TunnelClient) -> bool:
    """Whether the client has a live session (its sender open) right now."""
    sender = client._sender
    return sender is not None and not sender.closed


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from asgiref.sync import sync_to_async
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from fleet import services
    from fleet.models import Command, Node, NodeEvent
    from tenancy.services import workspace_create

    await sync_to_async(td.reset_database)()
    user = await sync_to_async(get_user_model().objects.create_user)("bench", password="x")
    token = (await sync_to_async(Token.objects.create)(user=user)).key
    workspace = await sync_to_async(workspace_create)(name="Bench", owner=user)
    cluster = await sync_to_async(services.cluster_create)(actor=user, workspace=workspace, name="bench")
    env = {
        "DATABASE_URL": os.environ["DATABASE_URL"],
        "REDIS_URL": os.environ["REDIS_URL"],
        "DJANGO_SETTINGS_MODULE": "cleverthis.settings.base",
        "AGENT_HEARTBEAT_INTERVAL_S": str(args.heartbeat),
        "AGENT_HELLO_TIMEOUT_S": "120",
        "AGENT_REGISTER_RATE": "100000/s",
        "DEBUG": "0",
        "LOG_LEVEL": "WARNING",
        "WEB_DRAIN_LB_S": "3",
        "WEB_DRAIN_DEADLINE_S": str(args.drain_deadline),
    }
    ports = [free_port() for _ in range(4)]
    webs = {}
    processes = []

    def start_web(i: int) -> None:
        webs[i] = web_server(workdir, ports[i], server="uvicorn", env=env, name=f"web-{i}")
        processes.append(webs[i])
        wait_until(lambda: port_open(ports[i]), timeout=60, what=f"web {i}")

    worker = celery_worker(workdir, env=env, name="worker")
    processes.append(worker)
    balancer = haproxy.LoadBalancer(workdir, ports)
    clients: list[TunnelClient] = []
    runners: list[CountingRunner] = []
    stop = asyncio.Event()
    tasks: list[asyncio.Future[int]] = []
    try:
        start_web(0)
        start_web(1)
        await blocking(
            functools.partial(wait_until, timeout=30, what="haproxy: old up"),
            lambda: balancer.servers_up() == {"web0", "web1"},
        )

        async def register(i: int) -> AgentConfig:
            _, raw = await sync_to_async(services.join_token_create)(cluster=cluster, actor=user)
            facts = p.HostFacts(hostname=f"sim-{i:05d}", cpu_count=8, memory_total_mb=32768)
            return await blocking(
                functools.partial(
                    join, url=balancer.url, token=raw, state_dir=workdir / f"agent-{i}", facts=facts, timeout=120
                )
            )

        configs: list[AgentConfig] = []
        for chunk in range(0, args.agents, 25):
            configs += await asyncio.gather(*(register(i) for i in range(chunk, min(args.agents, chunk + 25))))
        asyncio.get_running_loop().set_default_executor(InlineExecutor())
        for config in configs:
            runner = CountingRunner()
            runners.append(runner)
            clients.append(
                TunnelClient(
                    config,
                    lambda mode, settings, runner=runner: runner,
                    policy=ReconnectPolicy(base_s=0.5, cap_s=5),
                    hello_timeout_s=120,
                )
            )
        for client in clients:
            tasks.append(asyncio.ensure_future(client.run(stop)))
            await asyncio.sleep(1 / args.connect_rate)
        deadline = time.monotonic() + 180
        while sum(live(c) for c in clients) < args.agents and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        await asyncio.sleep(args.heartbeat + 2)
        online_before = await sync_to_async(Node.objects.filter(status="online").count)()
        print(f"  {sum(live(c) for c in clients)}/{args.agents} connected, {online_before} online", flush=True)
        sessions_before = [c.sessions for c in clients]

        # ---- load during the roll: agents sampled, a command a second, API polls
        gaps = [0.0] * len(clients)
        longest = [0.0] * len(clients)
        finished = threading.Event()
        answers: collections.Counter[str] = collections.Counter()
        online_counts: list[int] = []
        commands: list[Any] = []
        roll_started = time.time()

        async def sample_tunnels() -> None:
            last = time.monotonic()
            while not finished.is_set():
                await asyncio.sleep(0.1)
                now = time.monotonic()
                for i, client in enumerate(clients):
                    if live(client):
                        gaps[i] = 0.0
                    else:
                        gaps[i] += now - last
                        longest[i] = max(longest[i], gaps[i])
                last = now

        def poll_api() -> None:
            session = requests.Session()
            headers = {"Authorization": f"Token {token}", "Host": "localhost"}
            while not finished.is_set():
                for name, path in (("healthz", "/healthz"), ("nodes", "/api/v1/nodes/?limit=20")):
                    try:
                        status = session.get(balancer.url + path, headers=headers, timeout=10).status_code
                    except requests.RequestException:
                        status = 0
                    answers[f"{name} total"] += 1
                    answers[f"{name} 2xx"] += 200 <= status < 300
                time.sleep(0.5)

        def send_commands() -> None:
            from django.db import connection

            nodes = list(Node.objects.filter(cluster=cluster))
            rng = random.Random(7)
            try:
                while not finished.is_set():
                    node = rng.choice(nodes)
                    commands.extend(
                        services.command_dispatch(
                            actor=user,
                            cluster=cluster,
                            command_type="model.download",
                            payload={"model_id": "acme/tiny"},
                            node=node,
                        )
                    )
                    online_counts.append(Node.objects.filter(cluster=cluster, status="online").count())
                    time.sleep(1.0)
            finally:
                connection.close()

        sampler = asyncio.ensure_future(sample_tunnels())
        pollers = [threading.Thread(target=poll_api, daemon=True), threading.Thread(target=send_commands, daemon=True)]
        for thread in pollers:
            thread.start()
        await asyncio.sleep(3)

        # ---- the roll: two new processes, checked in; the two old ones drain and exit by themselves
        print("  rolling: starting the new web processes", flush=True)
        await blocking(start_web, 2)
        await blocking(start_web, 3)
        await blocking(
            functools.partial(wait_until, timeout=60, what="haproxy: new up"),
            lambda: {"web2", "web3"} <= balancer.servers_up(),
        )
        print("  rolling: draining the old ones", flush=True)
        drain_started = time.monotonic()
        for i in (0, 1):
            webs[i].popen.send_signal(signal.SIGTERM)
        for i in (0, 1):
            await blocking(webs[i].popen.wait, args.drain_deadline * 2 + 30)
        drain_s = time.monotonic() - drain_started
        await asyncio.sleep(args.heartbeat + 3)  # a late offline or reconnect shows by now
        finished.set()
        for thread in pollers:
            await blocking(thread.join, 30)
        await sampler

        # ---- results
        ids = [c.pk for c in commands]

        def outcomes() -> tuple[int, int]:
            settled = time.monotonic() + 30
            while time.monotonic() < settled:
                done = Command.objects.filter(pk__in=ids, status="succeeded").count()
                if done == len(ids):
                    break
                time.sleep(1)
            return done, NodeEvent.objects.filter(kind="offline", created_at__gte=_aware(roll_started)).count()

        succeeded, offline_events = await sync_to_async(outcomes)()
        twice = sum(1 for runner in runners for count in runner.runs.values() if count > 1)
        reconnects = collections.Counter(
            c.sessions - before for c, before in zip(clients, sessions_before, strict=True)
        )
        return {
            "agents": args.agents,
            "connected": sum(live(c) for c in clients),
            "reconnects": dict(sorted(reconnects.items())),
            "moves": sum(c.moves for c in clients),
            "gap_p50": statistics.median(longest),
            "gap_max": max(longest),
            "offline_events": offline_events,
            "fewest_online": min(online_counts) if online_counts else 0,
            "commands": len(ids),
            "succeeded": succeeded,
            "lost": len(ids) - succeeded,
            "twice": twice,
            "api": {name: (answers[f"{name} 2xx"], answers[f"{name} total"]) for name in ("healthz", "nodes")},
            "drain_s": drain_s,
            "load": os.getloadavg(),
            "online_before": online_before,
        }
    finally:
        stop.set()
        if tasks:
            await asyncio.wait(tasks, timeout=30)
        balancer.stop()
        for process in processes:
            process.stop()


def _aware(timestamp: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(timestamp, tz=UTC)


def goals(r: dict[str, Any]) -> list[tuple[str, str, bool]]:
    api_ok = all(ok == total for ok, total in r["api"].values())
    return [
        ("exactly 1 tunnel move per agent", f"reconnects {r['reconnects']}", r["reconnects"] == {1: r["agents"]}),
        ("no moment without a tunnel", f"longest gap {r['gap_max']:.2f} s", r["gap_max"] < 0.2),
        ("0 node-offline events", str(r["offline_events"]), r["offline_events"] == 0),
        ("0 commands lost", str(r["lost"]), r["lost"] == 0),
        ("each command executed once", f"{r['twice']} run twice", r["twice"] == 0),
        ("100 % of API requests 2xx", str(r["api"]), api_ok),
    ]


def main() -> None:
    import logging

    logging.getLogger("agent").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=150)
    parser.add_argument("--heartbeat", type=float, default=5.0, help="agents' heartbeat interval (s)")
    parser.add_argument("--connect-rate", type=float, default=50.0, help="tunnels opened per second at start")
    parser.add_argument("--drain-deadline", type=int, default=30, help="WEB_DRAIN_DEADLINE_S of the web processes")
    args = parser.parse_args()
    if not haproxy.available():
        sys.exit("web_roll: needs haproxy (apt-get install haproxy)")
    with tempfile.TemporaryDirectory(prefix="web-roll-") as tmp:
        print(f"roll of 2 web processes under {args.agents} agents (load {os.getloadavg()[0]:.2f} before)", flush=True)
        r = asyncio.run(run(args, Path(tmp)))
    print(f"agents connected before / after: {r['online_before']} online / {r['connected']} connected")
    print(f"tunnel reconnects per agent (count of agents): {r['reconnects']}; moves asked: {r['moves']}")
    print(f"seconds without a live tunnel, longest per agent: p50 {r['gap_p50']:.2f}, max {r['gap_max']:.2f}")
    print(f"node-offline events: {r['offline_events']}; fewest nodes online: {r['fewest_online']}")
    print(f"commands sent {r['commands']}, succeeded {r['succeeded']}, lost {r['lost']}, run twice {r['twice']}")
    for name, (ok, total) in r["api"].items():
        print(f"API {name}: {ok}/{total} answered 2xx ({100 * ok / max(1, total):.1f} %)")
    print(f"old processes drained and exited in {r['drain_s']:.1f} s; load average {r['load']}")
    for goal, value, ok in goals(r):
        print(f"  {'PASS' if ok else 'MISS'}  {goal}: {value}")


if __name__ == "__main__":
    main()

"""Roll benchmark: N simulated agents behind HAProxy, streams through their endpoints, while both web
processes are replaced and then Redis restarts.

    BENCH_DB=cleverthis_roll .venv/bin/python bench/web_roll.py --agents 150 --slots 64

Two uvicorn web processes (one worker each) a Celery worker and beat on a fresh database, with a Redis of
the bench's own (append-only file on, as the compose stack runs it), behind a real HAProxy with the compose
stack's backend settings (`tests.support.haproxy`: checks every second, retry-on). N real `TunnelClient`s
(real keys, registration, tunnels; commands answered at once) run in `--agent-processes` processes of
their own (`bench/roll_agents.py`) and dial HAProxy; the first `--slots` of them (at most) each report a
running public endpoint served by one local SSE server (`bench/stream_load.py`: `--tokens` chunks 0.25 s
apart).

The load (`bench/roll_phases.py`): stream slots opening one streamed completion after another through
HAProxy to those endpoints (`bench/roll_streams.py`, a process of its own), one command a second to a
random node and a fan-out to every node each `--fanout-every` s (`bench/roll_commands.py`, a process of
its own), the API (/healthz, the Nodes list) polled twice a second. The phases:

- steady: the load alone (a baseline);
- web roll: as `deploy/compose/roll` does with containers, two new web processes start, HAProxy checks
  them in, the two old ones get SIGTERM (they drain: /healthz 503, tunnels moved make-before-break, their
  streams finish) and exit by themselves;
- redis restart: Redis stops (SIGTERM, its append-only file written) and starts again on its port.

Printed per phase: tunnel reconnects per agent, seconds each agent was without a live tunnel (p50 / max of
its longest gap, sampled every 0.1 s), node-offline events and the fewest nodes online, streams completed /
cut / HTTP error, API requests answered 2xx, commands sent / lost / duplicated (run twice by one node),
and what explains them: commands not succeeded by status and their creation → success times, offline
events by reason, the dispatch queue, the agents processes' loop lag, the database's sessions by wait,
CPU per process; the machine's load, and the issue's goals with PASS or MISS.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("BENCH_DB", "cleverthis_roll")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# The bench's own Redis (it restarts it): this process and every process it starts use it.
REDIS_PORT = _free_port()
os.environ["REDIS_URL"] = f"redis://127.0.0.1:{REDIS_PORT}/0"

import tunnel_dispatch as td  # noqa: E402  (django.setup() on the bench database)
from roll_phases import AgentProcesses, CpuMeter, PhasedLoad, command_outcomes, offline_events  # noqa: E402
from stream_load import start_node_server  # noqa: E402

from agent import protocol as p  # noqa: E402
from agent.config import AgentConfig  # noqa: E402
from agent.registration import join  # noqa: E402
from tests.support import haproxy  # noqa: E402
from tests.support.processes import (  # noqa: E402
    VENV_BIN,
    ManagedProcess,
    celery_worker,
    free_port,
    port_open,
    wait_until,
    web_server,
)

_POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="bench")


async def blocking(fn: Any, *args: Any) -> Any:
    """`fn(*args)` on the benchmark's own threads."""
    return await asyncio.get_running_loop().run_in_executor(_POOL, functools.partial(fn, *args))


def start_redis(workdir: Path, name: str) -> ManagedProcess:
    """The bench's Redis on REDIS_PORT, its append-only file in `workdir` (kept across a restart)."""
    argv = [shutil.which("redis-server") or "redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1"]
    argv += ["--dir", str(workdir), "--save", "", "--appendonly", "yes", "--appendfsync", "everysec"]
    argv += ["--maxclients", "30000", "--tcp-backlog", "4096"]
    redis = ManagedProcess(name, argv, log_dir=workdir)
    wait_until(lambda: port_open(REDIS_PORT), timeout=30, what="redis")
    return redis


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from asgiref.sync import sync_to_async
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from fleet import services
    from fleet.models import Node
    from tenancy.services import workspace_create
    from tests.support.endpoints import endpoint_row

    redis = start_redis(workdir, "redis")
    processes: list[ManagedProcess] = []
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
    }
    if args.drain_deadline:
        env["WEB_DRAIN_DEADLINE_S"] = str(args.drain_deadline)
    ports = [free_port() for _ in range(4)]
    node_port = free_port()
    webs = {}
    cpu = CpuMeter(td.BENCH_DB)
    cpu.add("bench", os.getpid(), children=False)
    cpu.add("redis", redis.popen.pid)

    def start_web(i: int) -> None:
        webs[i] = web_server(workdir, ports[i], server="uvicorn", env=env, name=f"web-{i}")
        processes.append(webs[i])
        cpu.add(f"web-{i}", webs[i].popen.pid)
        wait_until(lambda: port_open(ports[i]), timeout=60, what=f"web {i}")

    worker = celery_worker(workdir, env=env, name="worker")
    processes.append(worker)
    cpu.add("worker", worker.popen.pid)
    # beat, as the stack runs it: among its passes, the resend of commands whose dispatch task the broker
    # refused (Redis restarting)
    beat = [str(VENV_BIN / "celery"), "-A", "cleverthis", "beat", "--loglevel=WARNING"]
    beat_env = {**env, "CELERY_BEAT_SCHEDULE_FILENAME": str(workdir / "celerybeat-schedule")}
    processes.append(ManagedProcess("beat", beat, log_dir=workdir, env=beat_env))
    cpu.add("beat", processes[-1].popen.pid)
    balancer = haproxy.LoadBalancer(workdir, ports)
    cpu.add("haproxy", balancer.process.popen.pid)
    node_server = start_node_server(node_port, args.tokens, 0.25) if args.slots else None
    if node_server is not None:
        cpu.add("sse server", node_server.pid)
    agents: AgentProcesses | None = None
    load: PhasedLoad | None = None
    load_stopped = False
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
        # one public endpoint on each of the first nodes, served by the local SSE server: the agents report
        # it from their first inventory on; its row is made once they are online (an agent process's first
        # Hello carries a blank inventory, which would find it gone)
        slugs = [secrets.token_hex(6) for _ in range(min(args.slots, args.agents))]
        listing = [
            {
                "state_dir": str(workdir / f"agent-{i}"),
                "endpoint": {"slug": slugs[i], "port": node_port} if i < len(slugs) else None,
            }
            for i in range(len(configs))
        ]
        agents = AgentProcesses(listing, args.agent_processes, workdir, args.connect_rate)
        for name, pid in agents.pids.items():
            cpu.add(name, pid)
        deadline = time.monotonic() + 300
        while (connected := await blocking(agents.live)) < args.agents and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        await asyncio.sleep(args.heartbeat + 2)
        online_before = await sync_to_async(Node.objects.filter(status="online").count)()
        hosts = []
        for slug, config in zip(slugs, configs, strict=False):
            node = await sync_to_async(Node.objects.get)(pk=config.node_id)
            endpoint = await sync_to_async(endpoint_row)(
                cluster=cluster, node=node, slug=slug, model_id="bench", status="running", port=node_port, public=True
            )
            hosts.append(endpoint.hostname)
        print(f"  {connected}/{args.agents} connected, {online_before} online", flush=True)

        # ---- the load, then the phases
        load = PhasedLoad(agents, balancer.url, cpu, os.environ["REDIS_URL"])
        await blocking(load.begin, "steady")
        load.start(token)
        sender = [sys.executable, str(REPO / "bench" / "roll_commands.py"), "--cluster", str(cluster.pk)]
        sender += ["--user", str(user.pk), "--fanout-every", str(args.fanout_every)]
        cpu.add("commands", load.start_child("commands", sender, load.sends, workdir / "commands.log"))
        if hosts:
            streams = [sys.executable, str(REPO / "bench" / "roll_streams.py"), "--port", str(balancer.port)]
            streams += ["--slots", str(args.slots), "--tokens", str(args.tokens), *hosts]
            cpu.add("streams", load.start_child("streams", streams, load.streams, workdir / "streams.log"))
        await asyncio.sleep(args.steady)
        await blocking(load.end)

        await blocking(load.begin, "web roll")
        await blocking(start_web, 2)
        await blocking(start_web, 3)
        await blocking(
            functools.partial(wait_until, timeout=60, what="haproxy: new up"),
            lambda: {"web2", "web3"} <= balancer.servers_up(),
        )
        drain_started = time.monotonic()
        for i in (0, 1):
            webs[i].popen.send_signal(signal.SIGTERM)
        if args.logs:  # what a new replica's threads are doing a while into the moves
            spy = asyncio.ensure_future(_py_spy(args.logs, webs[2].popen.pid, (15, 40, 70)))
        for i in (0, 1):
            await blocking(webs[i].popen.wait, 600)
        drain_s = time.monotonic() - drain_started
        await asyncio.sleep(args.heartbeat + 3)  # a late offline or reconnect shows by now
        await blocking(load.end)

        await blocking(load.begin, "redis restart")
        redis_stopped = time.monotonic()
        await blocking(redis.stop)
        redis = await blocking(start_redis, workdir, "redis-again")
        cpu.add("redis", redis.popen.pid)
        redis_down_s = time.monotonic() - redis_stopped
        await asyncio.sleep(max(args.heartbeat * 3, 20))  # the tunnels' groups rejoin, commands flow again
        await blocking(load.end)

        await blocking(load.stop)
        load_stopped = True

        # ---- results, per phase
        def outcomes() -> list[tuple[dict[str, Any], dict[str, int]]]:
            settled = time.monotonic() + args.settle  # (the beat resends a command stuck 30 s, every 30 s)
            while time.monotonic() < settled:
                if all(command_outcomes(ph.started, ph.ended)["not_succeeded"] == {} for ph in load.phases):
                    break
                time.sleep(2)
            return [
                (command_outcomes(ph.started, ph.ended), offline_events(ph.started, ph.ended)) for ph in load.phases
            ]

        counted = await sync_to_async(outcomes)()
        drained_logs = {i: _drain_lines(webs[i].log()) for i in (0, 1)}
        if args.logs:
            spy.cancel()
            args.logs.mkdir(parents=True, exist_ok=True)
            for log in workdir.glob("*.log"):
                shutil.copy(log, args.logs / log.name)
        return {
            "agents": args.agents,
            "slots": min(args.slots, len(hosts)),
            "online_before": online_before,
            "connected": await blocking(agents.live),
            "drain_s": drain_s,
            "drain_logs": drained_logs,
            "redis_down_s": redis_down_s,
            "load": os.getloadavg(),
            "phases": [load.report(ph, c, o, args.agents) for ph, (c, o) in zip(load.phases, counted, strict=True)],
        }
    finally:
        if load is not None and not load_stopped:
            load.stop()
        if agents is not None:
            agents.stop()
        balancer.stop()
        if node_server is not None:
            os.killpg(node_server.pid, signal.SIGTERM)
            node_server.wait(timeout=10)
        for process in processes:
            process.stop()
        redis.stop()


async def _py_spy(into: Path, pid: int, at_s: tuple[float, ...]) -> None:
    """`py-spy dump` of process `pid` at each of `at_s` seconds from now, into `into`/py-spy-<s>.txt."""
    into.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    for at in at_s:
        await asyncio.sleep(max(0.0, started + at - time.monotonic()))
        spy = await asyncio.create_subprocess_exec(
            str(VENV_BIN / "py-spy"), "dump", "--pid", str(pid),
            stdout=(into / f"py-spy-{at:.0f}.txt").open("wb"), stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        await spy.wait()


def _drain_lines(log: str) -> list[str]:
    """What a web process said of its drain (moves, the deadline)."""
    return [line.strip()[:200] for line in log.splitlines() if "drain" in line.lower()][:8]


def goals(r: dict[str, Any], phase: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """The issue's goals for one phase (a restart of Redis moves no tunnel: 0 reconnects is its goal)."""
    api_ok = all(ok == total for ok, total in phase["api"].values())
    moves = 0 if phase["phase"] != "web roll" else 1
    streams = phase["streams"]
    return [
        (
            f"exactly {moves} tunnel move(s) per agent",
            f"{phase['reconnects']}",
            phase["reconnects"] == {moves: r["agents"]},
        ),
        ("no moment without a tunnel", f"longest gap {phase['gap_max']:.2f} s", phase["gap_max"] < 0.2),
        ("0 node-offline events", str(phase["offline_events"]), phase["offline_events"] == 0),
        ("0 failed or cut streams", f"{streams}", streams["cut"] == 0 and streams["error"] == 0),
        ("100 % of API requests 2xx", str(phase["api"]), api_ok),
        ("0 commands lost", f"{phase['lost']} of {phase['commands']}", phase["lost"] == 0),
        ("each command executed once", f"{phase['duplicated']} duplicated", phase["duplicated"] == 0),
    ]


def main() -> None:
    import logging

    logging.getLogger("agent").setLevel(logging.ERROR)  # (thousands of Backoff warnings in a storm)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=150)
    parser.add_argument("--slots", type=int, default=64, help="stream slots (one endpoint per slot, up to N)")
    parser.add_argument("--tokens", type=int, default=20, help="tokens per stream, 0.25 s apart")
    parser.add_argument("--heartbeat", type=float, default=5.0, help="agents' heartbeat interval (s)")
    parser.add_argument("--connect-rate", type=float, default=50.0, help="tunnels opened per second at start")
    parser.add_argument(
        "--drain-deadline", type=int, default=0, help="WEB_DRAIN_DEADLINE_S of the web processes (0: the default)"
    )
    parser.add_argument("--agent-processes", type=int, default=4, help="processes the agents are split over")
    parser.add_argument("--logs", type=Path, help="keep the processes' logs (and py-spy dumps of a new web) here")
    parser.add_argument("--settle", type=float, default=90.0, help="seconds the commands get to succeed at the end")
    parser.add_argument("--fanout-every", type=float, default=10.0, help="a fan-out to every node each (s); 0: none")
    parser.add_argument("--steady", type=float, default=15.0, help="seconds of load before the roll")
    args = parser.parse_args()
    if not haproxy.available():
        sys.exit("web_roll: needs haproxy (apt-get install haproxy)")
    with tempfile.TemporaryDirectory(prefix="web-roll-") as tmp:
        print(f"{args.agents} agents, {args.slots} stream slots (load {os.getloadavg()[0]:.2f} before)", flush=True)
        r = asyncio.run(run(args, Path(tmp)))
    print(f"agents online before: {r['online_before']}; connected at the end: {r['connected']}")
    print(f"old web processes drained and exited in {r['drain_s']:.1f} s; Redis was down {r['redis_down_s']:.1f} s")
    print(f"load average at the end: {r['load']}")
    for i, lines in r["drain_logs"].items():
        print(f"web-{i} drain: {lines}")
    for phase in r["phases"]:
        print(f"--- {phase['phase']} ({phase['seconds']:.0f} s)")
        print(f"tunnel reconnects per agent (count of agents): {phase['reconnects']}")
        print(
            f"seconds without a live tunnel, longest per agent: p50 {phase['gap_p50']:.2f}, max {phase['gap_max']:.2f}"
        )
        print(f"node-offline events: {phase['offline_events']}; fewest nodes online: {phase['fewest_online']}")
        print(f"streams: {phase['streams']} {phase['stream_errors'] or ''}")
        for name, (ok, total) in phase["api"].items():
            print(f"API {name}: {ok}/{total} answered 2xx ({100 * ok / max(1, total):.1f} %)")
        print(
            f"commands sent {phase['commands']} (sends refused: {phase['refused']}), lost {phase['lost']}, "
            f"duplicated {phase['duplicated']}"
        )
        p50, p99, worst = phase["latency"]
        print(
            f"  not succeeded by status: {phase['lost_by_status']}; "
            f"creation → success p50 {p50:.1f} s, p99 {p99:.1f} s, max {worst:.1f} s"
        )
        print(f"  offline by reason: {phase['offline_reasons']}; a send took at most {phase['send_took_max']:.1f} s")
        print(
            f"  dispatch queue longest: {phase['queue_max']}; "
            f"agents' loop lag p99 {phase['lag'][0]:.2f} s, max {phase['lag'][1]:.2f} s"
        )
        print(f"  database sessions active (mean), by wait: {phase['db_waits']}")
        cpu = sorted(phase["cpu"].items(), key=lambda kv: -kv[1])
        seconds = max(1.0, phase["seconds"])
        print("  CPU (cores busy): " + ", ".join(f"{k} {v / seconds:.2f}" for k, v in cpu if v >= 0.01 * seconds))
        for goal, value, ok in goals(r, phase):
            print(f"  {'PASS' if ok else 'MISS'}  {goal}: {value}")


if __name__ == "__main__":
    main()

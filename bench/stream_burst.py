"""A burst of small proxied requests: tunnel messages per request and CPU per stream, before/after in one run.

    .venv/bin/python bench/stream_burst.py                                   # this tree only
    git archive <rev> | tar -x -C /tmp/before                                # an older checkout ...
    .venv/bin/python bench/stream_burst.py --before /tmp/before              # ... side by side, with ratios
    .venv/bin/python bench/stream_burst.py --burst 256 --rounds 8

For each tree (the older one first): a real daphne and a real agent of that tree (the agent through
`bench/counting_agent.py`, which counts the tunnel's messages at the agent), an HTTP server on the
node side, and an endpoint. Then `--rounds` bursts of `--burst` small GETs, all opened at once on fresh
connections through the tunnel's replica. Reported per proxied request: the stream messages the agent
received and the stream frames they carried, the messages it sent; and the CPU milliseconds per stream
of the daphne process and of the agent. PostgreSQL and Redis must be running; the database is BENCH_DB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleverthis.settings.base")
# DEBUG is off, as in production: a secret key of this run's own (the web processes it starts inherit it)
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/14")
BENCH_DB = os.environ.setdefault("BENCH_DB", "cleverthis_bench_burst")  # dropped and made afresh
os.environ["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{BENCH_DB}"

import django  # noqa: E402

django.setup()

from bench.proxy import control_plane_env, fetch, prepare_database  # noqa: E402
from tests.support.processes import (  # noqa: E402
    DAPHNE_MAX_MESSAGE_BYTES,
    VENV_BIN,
    ManagedProcess,
    free_port,
    port_open,
    wait_until,
)

SMALL = b'{"ok": true}'


class Node(BaseHTTPRequestHandler):
    """The service on the node: a tiny JSON answer."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(SMALL)))
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(SMALL)


def tree_daphne(tree: Path, log_dir: Path, port: int, env: dict[str, str], name: str) -> ManagedProcess:
    """daphne serving `tree`'s ASGI application (as `tests.support.processes.daphne`, in another tree)."""
    argv = [
        str(VENV_BIN / "daphne"),
        "-e",
        f"tcp:port={port}:interface=127.0.0.1:backlog=1024",
        f"--websocket-max-message-size={DAPHNE_MAX_MESSAGE_BYTES}",
        f"--websocket-max-frame-size={DAPHNE_MAX_MESSAGE_BYTES}",
        "cleverthis.asgi:application",
    ]
    return ManagedProcess(name, argv, log_dir=log_dir, env={**env, "PYTHONPATH": str(tree)}, cwd=tree)


def read_counts(path: Path) -> dict[str, int]:
    """The counting agent's latest counts (written five times a second)."""
    time.sleep(0.5)
    return json.loads(path.read_text())


async def burst(port: int, origin: str, size: int) -> list[float]:
    """`size` GETs opened at once on fresh connections; their latencies (s)."""

    async def one() -> float:
        started = time.perf_counter()
        await fetch("127.0.0.1", port, "/small", host_header=origin)
        return time.perf_counter() - started

    return list(await asyncio.gather(*(one() for _ in range(size))))


def measure_tree(label: str, tree: Path, args: argparse.Namespace, user: object, cluster: object) -> dict[str, float]:
    """Start `tree`'s daphne and counting agent, run the bursts, and return the per-request figures."""
    import psutil

    from fleet import services
    from fleet.models import Node as FleetNode
    from tests.support.endpoints import endpoint_row

    node_port = free_port()
    ThreadingHTTPServer.request_queue_size = 1024
    server = ThreadingHTTPServer(("127.0.0.1", node_port), Node)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = control_plane_env(AGENT_HEARTBEAT_INTERVAL_S="30")
    with tempfile.TemporaryDirectory(prefix=f"bench-burst-{label}-") as tmp:
        tmp_path = Path(tmp)
        web_port = free_port()
        web = tree_daphne(tree, tmp_path, web_port, env, f"daphne-{label}")
        agent = None
        try:
            wait_until(lambda: port_open(web_port), timeout=30, what="daphne")
            _, raw = services.join_token_create(cluster=cluster, actor=user)
            state, counts_path = tmp_path / "state", tmp_path / "counts.json"
            agent_env = {"PYTHONPATH": str(tree), "CLEVERTHIS_PROXY_PORTS": str(node_port)}
            join = ManagedProcess(
                f"join-{label}",
                [sys.executable, "-m", "agent", "join", "--url", f"http://127.0.0.1:{web_port}", "--token", raw,
                 "--state-dir", str(state)],
                log_dir=tmp_path, env=agent_env, cwd=tree,
            )  # fmt: skip
            assert join.popen.wait(timeout=60) == 0, join.log()
            node_id = json.loads((state / "node.json").read_text())["node_id"]
            agent = ManagedProcess(
                f"agent-{label}",
                [sys.executable, str(REPO / "bench" / "counting_agent.py"), str(counts_path), "--log-level", "WARNING",
                 "run", "--state-dir", str(state)],
                log_dir=tmp_path, env=agent_env, cwd=tree,
            )  # fmt: skip
            wait_until(lambda: FleetNode.objects.filter(pk=node_id, connected=True).exists(), timeout=30, what="agent")
            time.sleep(1.5)  # let the agent's first inventory report land (it reconciles endpoints)
            node = FleetNode.objects.get(pk=node_id)
            endpoint = endpoint_row(
                cluster=cluster, node=node, model_id=f"bench/{label}", status="running", port=node_port, public=True
            )
            protocol = node.protocol_version
            asyncio.run(burst(web_port, endpoint.hostname, args.burst))  # warm up
            processes = {"daphne": psutil.Process(web.popen.pid), "agent": psutil.Process(agent.popen.pid)}
            before = read_counts(counts_path)
            cpu_before = {role: sum(proc.cpu_times()[:2]) for role, proc in processes.items()}
            latencies: list[float] = []
            for _ in range(args.rounds):
                latencies += asyncio.run(burst(web_port, endpoint.hostname, args.burst))
                time.sleep(0.3)  # the streams' last frames (ends) settle between bursts
            after = read_counts(counts_path)
            cpu_after = {role: sum(proc.cpu_times()[:2]) for role, proc in processes.items()}
        finally:
            if agent is not None:
                agent.stop()
            web.stop()
            server.shutdown()
            server.server_close()
    requests = args.rounds * args.burst
    assert after["received_opens"] - before["received_opens"] == requests, (before, after)  # nothing else ran
    latencies.sort()
    return {
        "protocol": protocol,
        "messages to agent": (after["received_stream_messages"] - before["received_stream_messages"]) / requests,
        "stream frames to agent": (after["received_stream_frames"] - before["received_stream_frames"]) / requests,
        "messages from agent": (after["sent_messages"] - before["sent_messages"]) / requests,
        "daphne CPU ms": (cpu_after["daphne"] - cpu_before["daphne"]) * 1000 / requests,
        "agent CPU ms": (cpu_after["agent"] - cpu_before["agent"]) * 1000 / requests,
        "burst p50 ms": statistics.median(latencies) * 1000,
        "burst p99 ms": latencies[int(0.99 * (len(latencies) - 1))] * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--burst", type=int, default=256, help="requests opened at once")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", type=Path, help="an older checkout to measure first, for ratios")
    args = parser.parse_args()
    user, cluster = prepare_database()
    trees = {"before": args.before.resolve()} if args.before else {}
    trees["this tree"] = REPO
    results = {label: measure_tree(label.replace(" ", "-"), tree, args, user, cluster) for label, tree in trees.items()}

    labels = list(results)
    print(f"\n{args.rounds} bursts of {args.burst} small GETs opened at once, through the tunnel's daphne")
    header = f"{'per proxied request':<28}" + "".join(f"{label:>14}" for label in labels)
    print(header + ("     after/before" if len(labels) == 2 else ""))
    for key in next(iter(results.values())):
        values = [results[label][key] for label in labels]
        line = f"{key:<28}" + "".join(f"{value:>14.2f}" for value in values)
        if len(values) == 2 and values[0]:
            line += f"{values[1] / values[0]:>17.2f}"
        print(line)


if __name__ == "__main__":
    main()

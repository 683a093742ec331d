"""Streaming inference through the proxy: direct vs the endpoint URL, side by side in one run.

    .venv/bin/python bench/inference_proxy.py
    .venv/bin/python bench/inference_proxy.py --concurrency 1 64 256 1024 --tokens 100 --interval-ms 20

Sets up, on this machine: PostgreSQL + Redis (running), two real daphne replicas, a real agent joined to
the first, and on the "node" an OpenAI-compatible streaming server (`POST /v1/chat/completions` with
`"stream": true` answers server-sent events: one `data:` event per token at a fixed interval, then
`data: [DONE]`). The same load (N concurrent streams, each on its own connection) runs against:
- direct: the node server itself;
- proxied: the endpoint's own origin (`endpoint-<slug>.<ENDPOINT_DOMAIN>`) on the replica holding the
  tunnel (daphne → tunnel → agent → server);
- other replica: the same URL on a replica that does not hold the tunnel (over a peer link to the first).

Printed per concurrency, one column per target: time to first token p50/p99, inter-token latency
p50/p99, completed streams and errors, tokens/s in total, CPU seconds per 1,000 tokens per process,
and the agent's heartbeat round trip (it heartbeats every 0.2 s here) during the load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("BENCH_DB", "cleverthis_bench_inference")

from proxy import control_plane_env, cpu_seconds, heartbeat_rtts, prepare_database, redis_pid  # noqa: E402

from tests.support.live import agent_join, agent_run  # noqa: E402
from tests.support.processes import daphne, free_port, port_open, wait_until  # noqa: E402

MARKER = b'"delta"'
DONE = b"data: [DONE]"
BACKLOG = 4096


# -- the node's streaming server ------------------------------------------------------------------


def serve_tokens(port: int, tokens: int, interval_s: float) -> None:
    """An asyncio SSE server (a process of its own): `tokens` events, one every `interval_s`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if length:
                await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                b"Connection: close\r\n\r\n"
            )
            for index in range(tokens):
                event = {
                    "id": "bench",
                    "object": "chat.completion.chunk",
                    "choices": [{"delta": {"content": f"t{index} "}}],
                }
                writer.write(b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n")
                await writer.drain()
                await asyncio.sleep(interval_s)
            writer.write(DONE + b"\n\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=BACKLOG)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# -- the client ------------------------------------------------------------------------------------


@dataclass
class StreamResult:
    """What one client stream saw."""

    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None


async def one_stream(port: int, host: str, tokens: int) -> StreamResult:
    """One streaming chat completion on a fresh connection; times every token as it arrives."""
    result = StreamResult()
    body = json.dumps({"model": "bench", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
    started = time.perf_counter()
    writer = None
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + host.encode() + b"\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            rest = await reader.read(300)
            result.error = f"HTTP {status} {rest[:120]!r}"
            return result
        tail = b""
        last = None
        seen_done = False
        while chunk := await reader.read(65536):
            now = time.perf_counter()
            data = tail + chunk
            count = data.count(MARKER)
            for _ in range(count):
                if result.ttft is None:
                    result.ttft = now - started
                elif last is not None:
                    result.gaps.append(now - last)
                last = now
            result.tokens += count
            seen_done = seen_done or DONE in data
            tail = data[-(len(DONE) - 1) :]
        if result.tokens != tokens or not seen_done:
            result.error = f"incomplete: {result.tokens} of {tokens} tokens"
    except (OSError, asyncio.IncompleteReadError, ValueError) as error:
        result.error = f"{type(error).__name__}: {error}"
    finally:
        if writer is not None:
            writer.close()
    return result


async def load(port: int, host: str, concurrency: int, tokens: int) -> tuple[list[StreamResult], float]:
    """`concurrency` streams at once: their results and the wall time until the last ended."""
    started = time.perf_counter()
    results = await asyncio.gather(*(one_stream(port, host, tokens) for _ in range(concurrency)))
    return list(results), time.perf_counter() - started


def pct(values: list[float], q: float) -> float:
    return sorted(values)[int(q * (len(values) - 1))] if values else float("nan")


def summarize(results: list[StreamResult], elapsed: float) -> dict[str, object]:
    ttfts = [r.ttft for r in results if r.ttft is not None]
    gaps = [gap for r in results for gap in r.gaps]
    errors = [r.error for r in results if r.error]
    return {
        "ttft_p50": pct(ttfts, 0.5) * 1000,
        "ttft_p99": pct(ttfts, 0.99) * 1000,
        "itl_p50": pct(gaps, 0.5) * 1000,
        "itl_p99": pct(gaps, 0.99) * 1000,
        "completed": len(results) - len(errors),
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
        "tokens": sum(r.tokens for r in results),
        "tokens_s": sum(r.tokens for r in results) / elapsed,
    }


# -- set-up ----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 256, 1024])
    parser.add_argument("--tokens", type=int, default=100, help="tokens per stream")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="time between tokens on the node")
    parser.add_argument(
        "--targets",
        nargs="+",
        choices=["direct", "proxied", "other replica"],
        default=["direct", "proxied", "other replica"],
        help="measure only these columns (quote 'other replica')",
    )
    parser.add_argument("--keep", metavar="DIR", help="work in DIR (daphne/agent logs) instead of a temp dir")
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    from fleet import services
    from fleet.models import Node as FleetNode
    from fleet.workloads.models import Endpoint

    node_port = free_port()
    node_server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(node_port), str(args.tokens), str(args.interval_ms / 1000)],
        start_new_session=True,
    )
    wait_until(lambda: port_open(node_port), timeout=30, what="node server")

    user, cluster = prepare_database()
    env = control_plane_env()
    table: dict[int, dict[str, dict[str, object]]] = {}
    windows: dict[int, tuple[float, float]] = {}
    cpu: dict[int, dict[str, dict[str, float]]] = {}
    with contextlib.ExitStack() as stack:
        if args.keep:
            tmp_path = Path(args.keep)
            tmp_path.mkdir(parents=True, exist_ok=True)
        else:
            tmp_path = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-inference-")))
        web_port, other_port = free_port(), free_port()
        web = daphne(tmp_path, web_port, env=env)
        agent = other = None
        try:
            wait_until(lambda: port_open(web_port), timeout=30, what="daphne")
            _, raw = services.join_token_create(cluster=cluster, actor=user)
            joined = agent_join(f"http://127.0.0.1:{web_port}", raw, tmp_path / "state")
            assert joined.returncode == 0, joined.stderr
            agent = agent_run(tmp_path / "state", tmp_path, env={"CLEVERTHIS_PROXY_PORTS": str(node_port)})
            wait_until(lambda: FleetNode.objects.filter(connected=True).exists(), timeout=30, what="agent")
            time.sleep(1.5)  # the agent's first inventory report reconciles endpoints
            node = FleetNode.objects.get()
            endpoint = Endpoint.objects.create(
                cluster=cluster, node=node, model_id="bench/m", status="running", port=node_port, public=True
            )
            origin = endpoint.hostname
            other = daphne(tmp_path, other_port, env=env, name="daphne-other")
            wait_until(lambda: port_open(other_port), timeout=30, what="second daphne")
            targets = {
                "direct": (node_port, "node"),
                "proxied": (web_port, origin),
                "other replica": (other_port, origin),
            }
            targets = {label: target for label, target in targets.items() if label in args.targets}
            pids = {
                "bench client": [os.getpid()],
                "node server": [node_server.pid],
                "daphne (tunnel)": [web.popen.pid],
                "daphne (other)": [other.popen.pid],
                "agent": [agent.popen.pid],
                "redis": [redis_pid()],
            }

            async def run() -> None:
                for port, host in targets.values():  # warm up
                    await load(port, host, 4, args.tokens)
                for concurrency in args.concurrency:
                    table[concurrency] = {}
                    cpu[concurrency] = {}
                    windows[concurrency] = (time.time(), 0.0)
                    for label, (port, host) in targets.items():
                        before = cpu_seconds(pids)
                        results, elapsed = await load(port, host, concurrency, args.tokens)
                        after = cpu_seconds(pids)
                        summary = summarize(results, elapsed)
                        table[concurrency][label] = summary
                        thousands = max(summary["tokens"], 1) / 1000
                        cpu[concurrency][label] = {role: (after[role] - before[role]) / thousands for role in pids}
                        await asyncio.sleep(1)
                    windows[concurrency] = (windows[concurrency][0], time.time())

            # The client's heap (Django, the models) frozen out of the collector: a full collection falling
            # inside a measurement held all 256 first tokens back ~150 ms, in the direct column of one
            # run and not the next, and every ratio to direct with it.
            gc.collect()
            gc.freeze()
            asyncio.run(run())
            time.sleep(0.5)
            log = agent.log()
        finally:
            for process in (other, agent):
                if process is not None:
                    process.stop()
            web.stop()
            os.killpg(node_server.pid, signal.SIGTERM)
            node_server.wait(10)

    labels = [label for label in ("direct", "proxied", "other replica") if label in args.targets]
    compared = [label for label in labels if label != "direct"] if "direct" in labels else []
    print(f"\n{args.tokens} tokens per stream, one every {args.interval_ms:g} ms; each stream on its own connection")
    for concurrency, by_label in table.items():
        print(f"\n== {concurrency} concurrent streams")
        print(
            f"{'':<34}"
            + "".join(f"{label:>15}" for label in labels)
            + "".join(f"{label + '/direct':>22}" for label in compared)
        )

        def row(name: str, key: str, unit: str, ratio: bool = True, by_label: dict = by_label) -> None:
            values = {label: float(by_label[label][key]) for label in labels}
            direct = values.get("direct") or 0.0
            tail = "".join(f"{values[label] / direct:>22.2f}" for label in compared) if ratio and direct else ""
            print(f"{name:<34}" + "".join(f"{value:>15.1f}" for value in values.values()) + tail + f"   {unit}")

        row("TTFT p50", "ttft_p50", "ms")
        row("TTFT p99", "ttft_p99", "ms")
        row("inter-token p50", "itl_p50", "ms")
        row("inter-token p99", "itl_p99", "ms")
        row("completed streams", "completed", "", ratio=False)
        row("errors", "errors", "", ratio=False)
        row("tokens/s (all streams)", "tokens_s", "tok/s")
        print("CPU s per 1,000 tokens:")
        for role in next(iter(cpu[concurrency].values())):
            print(f"    {role:<30}" + "".join(f"{cpu[concurrency][label][role]:>15.3f}" for label in labels))
        for label in labels:
            if by_label[label]["first_error"]:
                print(f"  first error ({label}): {by_label[label]['first_error']}")
        rtts = heartbeat_rtts(log, *windows[concurrency])
        print(
            f"heartbeat round trip during this load: p50 {pct(rtts, 0.5):.1f} ms, p99 {pct(rtts, 0.99):.1f} ms "
            f"({len(rtts)} samples)"
        )


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--serve":
        serve_tokens(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    else:
        main()

"""The stream slots of `bench/web_roll.py`, in a process of its own (no Django): each slot opens one streamed
chat completion after another through the load balancer to an endpoint on a simulated node, until its
stdin closes.

    python bench/roll_streams.py --port 8443 --tokens 20 endpoint-a.endpoints.localhost endpoint-b... < ...

Slot i streams from host i (modulo the hosts given). Each finished stream is one JSON line on stdout:
`{"started": <epoch s>, "ended": <epoch s>, "outcome": "completed" | "cut" | "error", "error": ...}`. A
stream is cut when its answer began (HTTP 200 and at least one token) but did not arrive whole; it is an
error when no token came (an HTTP error, a refused or reset connection). The streams themselves are
`bench/stream_load.one_stream` (one fresh connection each).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stream_load import one_stream, run_loop


def outcome(tokens_seen: int, error: str | None) -> str:
    """completed, cut (the answer began but did not end whole) or error (no token reached the client)."""
    if error is None:
        return "completed"
    return "cut" if tokens_seen > 0 else "error"


async def slots(port: int, hosts: list[str], count: int, tokens: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not sys.stdin.buffer.read1(4096) else None)

    async def slot(index: int) -> None:
        host = hosts[index % len(hosts)]
        await asyncio.sleep(index * 0.02)  # (the slots start spread, not as one burst)
        while not stop.is_set():
            started = time.time()
            result = await one_stream(port, host, tokens)
            line = {"started": started, "ended": time.time(), "outcome": outcome(result.tokens, result.error)}
            if result.error is not None:
                line["error"] = result.error[:200]
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()
            if result.error is not None:
                await asyncio.sleep(0.2)  # (a slot that failed does not knock again at once)

    tasks = [asyncio.ensure_future(slot(i)) for i in range(count)]
    await stop.wait()
    await asyncio.wait(tasks, timeout=120)  # the streams running finish
    for task in tasks:
        task.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True, help="the load balancer's port")
    parser.add_argument("--slots", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=20, help="tokens the node's server sends per stream")
    parser.add_argument("hosts", nargs="+", help="the endpoints' host names")
    args = parser.parse_args()
    run_loop(slots(args.port, args.hosts, args.slots, args.tokens))


if __name__ == "__main__":
    main()

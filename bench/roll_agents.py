"""One agents process of `bench/web_roll.py`: real `TunnelClient`s for a share of the registered nodes, with
what the roll bench counts measured here, beside the agents, so the bench's other work cannot starve them.

    python bench/roll_agents.py LISTING.json [--connect-rate 50]

LISTING.json: `[{"state_dir": ..., "endpoint": {"slug": ..., "port": ...} | null}, ...]`. Each agent's
executor answers at once (`CountingRunner`: it counts how often each idempotency key ran on its node) and
reports its endpoint (when it has one) as running. One command a line on stdin, one JSON line answered:

    live    {"live": <agents with a live session>, "sessions": <sessions welcomed so far>}
    phase   a new phase begins: the longest gaps, the loop's lag and this process's CPU count from now;
            {"ok": true}
    report  what the phase came to, per agent in listing order: {"sessions": [...], "longest_gap": [...],
            "twice": [<idempotency keys run more than once on one node>], "lag_max": <s>, "lag_p99": <s>,
            "cpu_s": <this process's CPU seconds in the phase>}
    stop    stops every client, answers {"stopped": true} and exits

Each agent's tunnel is sampled every 0.1 s (live: its session's sender open); `lag` is how late a 0.1 s
sleep of this loop woke (an overloaded agents process shows here, not as a fault of the control plane).
No Django here, like the agent itself.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from sim_agents import InstantRunner, serve_commands  # noqa: E402

from agent import protocol as p  # noqa: E402


class CountingRunner(InstantRunner):
    """InstantRunner that counts how often each idempotency key really ran on this node, and reports the
    node's endpoint (when it has one) as running on the local SSE server's port."""

    def __init__(self, endpoint: p.EndpointInfo | None = None) -> None:
        super().__init__()
        self.runs: collections.Counter[str] = collections.Counter()
        self.endpoint = endpoint

    def run(self, command: p.Command, progress):  # type: ignore[no-untyped-def]
        self.runs[command.idempotency_key] += 1
        return super().run(command, progress)

    def inventory(self, gpus: list[p.GpuInfo]) -> p.Inventory:
        return p.Inventory(gpus=gpus, endpoints=[self.endpoint] if self.endpoint else [])

    def proxy_ports(self) -> set[int]:
        return {self.endpoint.port} if self.endpoint else set()


def live(client: Any) -> bool:
    """Whether the client has a live session (its sender open) right now."""
    sender = client._sender
    return sender is not None and not sender.closed


class Watch:
    """The longest gap without a live tunnel per agent and the loop's lag, since the phase began."""

    def __init__(self, clients: list[Any]) -> None:
        self.clients = clients
        self.gaps = [0.0] * len(clients)
        self.longest = [0.0] * len(clients)
        self.lags: list[float] = []
        self.cpu_at = time.process_time()

    def begin(self) -> None:
        self.longest = [0.0] * len(self.clients)
        self.lags = []
        self.cpu_at = time.process_time()

    async def sample(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            self.lags.append(max(0.0, now - last - 0.1))
            for i, client in enumerate(self.clients):
                if live(client):
                    self.gaps[i] = 0.0
                    continue
                self.gaps[i] += now - last
                self.longest[i] = max(self.longest[i], self.gaps[i])
            last = now


async def serve(listing: list[dict[str, Any]], connect_rate: float) -> None:
    from agent.config import AgentConfig
    from agent.transport.tunnel import ReconnectPolicy, TunnelClient

    runners = [
        CountingRunner(p.EndpointInfo(e["slug"], "bench", e["port"], "running") if (e := entry["endpoint"]) else None)
        for entry in listing
    ]
    clients = [
        TunnelClient(
            AgentConfig.load(Path(entry["state_dir"])),
            lambda mode, settings, runner=runner: runner,
            policy=ReconnectPolicy(base_s=0.5, cap_s=5),
            hello_timeout_s=120,
        )
        for entry, runner in zip(listing, runners, strict=True)
    ]
    watch = Watch(clients)
    sessions_before = [0] * len(clients)

    def answer(line: str) -> dict[str, Any] | None:
        nonlocal sessions_before
        if line == "live":
            return {"live": sum(1 for c in clients if live(c)), "sessions": sum(c.sessions for c in clients)}
        if line == "phase":
            watch.begin()
            sessions_before = [c.sessions for c in clients]
            return {"ok": True}
        if line == "report":
            lags = sorted(watch.lags) or [0.0]
            return {
                "sessions": [c.sessions - b for c, b in zip(clients, sessions_before, strict=True)],
                "longest_gap": list(watch.longest),
                "twice": [key for r in runners for key, n in r.runs.items() if n > 1],
                "lag_max": lags[-1],
                "lag_p99": lags[min(len(lags) - 1, int(0.99 * len(lags)))],
                "cpu_s": time.process_time() - watch.cpu_at,
            }
        return None

    sampler = asyncio.ensure_future(watch.sample())
    try:
        await serve_commands(clients, answer, connect_rate)
    finally:
        sampler.cancel()


def main() -> None:
    import logging

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("listing", type=Path)
    parser.add_argument("--connect-rate", type=float, default=50.0, help="tunnels opened per second")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # (thousands of Backoff warnings in a storm)
    # asyncio's own loop, as the agent runs (its stream proxy takes asyncio's transports, not uvloop's)
    asyncio.run(serve(json.loads(args.listing.read_text()), args.connect_rate))


if __name__ == "__main__":
    main()

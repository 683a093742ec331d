"""Simulated agents for the fleet benchmarks: real tunnels, an executor that answers at once.

`InstantRunner` is the simulated executor. Run as a script, this module is one agents process of
`bench/fleet_scale.py` (one per core): it runs a real `TunnelClient` for each state directory listed
in a file (nodes the benchmark registered), opening them at `--connect-rate` tunnels per second, and
answers one-line commands on stdin with one JSON line on stdout:

    stats   {"connected": <clients in a live session now>, "sessions": <sessions begun so far>,
             "acks": <heartbeats answered so far>,
             "rtts": [<round trips (s) of heartbeats answered since the previous stats>]}
    stop    stops every client, answers {"stopped": true} and exits

End of input (the benchmark died) stops every client the same way.

Cheap by construction, so the machine's time goes to the control plane: one event loop (uvloop when
installed) per process and no thread at all. The real client hands its blocking calls (reading the
host's inventory, the runner) to `asyncio.to_thread`; here the loop's default executor is
`InlineExecutor`, which runs them on the spot — they are instant for a simulated node (the
`InstantRunner`, a psutil read), so the wire protocol, keys and frames stay the real client's while
thousands of clients share one thread instead of a pool's hand-offs. Stdin is read by the loop too.

It never imports Django, like the agent itself.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent import protocol as p  # noqa: E402


class InstantRunner:
    """Simulated executor: every command succeeds at once (the control plane's path is what we time)."""

    def __init__(self) -> None:
        self.done: dict[str, p.Result] = {}

    def run(self, command: p.Command, progress) -> p.Result:  # type: ignore[no-untyped-def]
        result = p.Result(command_id=command.command_id, data={"simulated": True})
        self.done[command.idempotency_key] = result
        return result

    def completed(self, key: str) -> p.Result | None:
        return self.done.get(key)

    def inventory(self, gpus: list[p.GpuInfo]) -> p.Inventory:
        return p.Inventory(gpus=gpus)

    def proxy_ports(self) -> set[int]:
        return set()


class InlineExecutor(ThreadPoolExecutor):
    """An executor that runs each call at once in the caller's thread (it never starts a thread).

    A subclass of ThreadPoolExecutor only because `loop.set_default_executor` accepts nothing else."""

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting coroutine, as a pool thread would
            future.set_exception(exc)
        return future


async def serve_commands(
    clients: Sequence[Any],
    answer: Callable[[str], dict[str, Any] | None],
    connect_rate: float,
    *,
    source: IO[Any] | None = None,
    out: IO[str] | None = None,
) -> None:
    """Run `clients` (each `run(stop)`, opened `connect_rate` per second) while answering one command a line of
    `source` (stdin) with one JSON line on `out` (stdout): `answer(line)`, or an error where it returns None.
    ``stop`` or the end of input stops every client (waiting up to 30 s) and answers {"stopped": true}.
    Blocking calls run on the loop's thread (`InlineExecutor`)."""
    loop = asyncio.get_running_loop()
    loop.set_default_executor(InlineExecutor())
    out = out or sys.stdout
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), source or sys.stdin)
    stop = asyncio.Event()
    tasks: list[asyncio.Future[Any]] = []

    async def connect() -> None:
        started = loop.time()
        for i, client in enumerate(clients):
            tasks.append(asyncio.ensure_future(client.run(stop)))
            ahead = started + (i + 1) / connect_rate - loop.time()
            if ahead > 0:
                await asyncio.sleep(ahead)  # a steady connect ramp, not a storm

    ramp = asyncio.ensure_future(connect())
    while (line := (await commands.readline()).decode().strip()) and line != "stop":
        reply = answer(line)
        print(json.dumps(reply if reply is not None else {"error": f"unknown command {line!r}"}), file=out, flush=True)
    ramp.cancel()
    stop.set()
    if tasks:
        await asyncio.wait(tasks, timeout=30)
    print(json.dumps({"stopped": True}), file=out, flush=True)


async def serve(state_dirs: list[Path], connect_rate: float = 100.0) -> None:
    """Run one tunnel per state directory, opened `connect_rate` per second, and answer `stats`/`stop` lines."""
    from agent.config import AgentConfig
    from agent.transport.tunnel import ReconnectPolicy, TunnelClient

    clients = [
        TunnelClient(
            AgentConfig.load(state_dir),
            lambda mode, settings: InstantRunner(),
            policy=ReconnectPolicy(base_s=1.0, cap_s=10),
            hello_timeout_s=120,
        )
        for state_dir in state_dirs
    ]
    seen = [0] * len(clients)

    def answer(line: str) -> dict[str, Any] | None:
        if line != "stats":
            return None
        rtts: list[float] = []
        for i, client in enumerate(clients):
            answered = list(client.heartbeat_rtts)
            rtts += answered[seen[i] :]
            seen[i] = len(answered)
        return {
            "connected": sum(1 for c in clients if c._sender is not None),  # a live session's sender
            "sessions": sum(c.sessions for c in clients),
            "acks": sum(seen),
            "rtts": rtts,
        }

    await serve_commands(clients, answer, connect_rate)


if __name__ == "__main__":
    import argparse
    import logging

    from stream_load import run_loop

    parser = argparse.ArgumentParser(description="one agents process of bench/fleet_scale.py")
    parser.add_argument("listing", type=Path, help="a file listing one agent state directory a line")
    parser.add_argument("--connect-rate", type=float, default=100.0, help="tunnels opened per second")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    listed = args.listing.read_text().split()
    run_loop(serve([Path(entry) for entry in listed], connect_rate=args.connect_rate))

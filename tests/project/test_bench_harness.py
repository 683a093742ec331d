"""The benchmarks' own harness: load generator processes that count every chunk and leave nothing behind,
and simulated agents whose blocking calls never start a thread and whose command loop (one JSON answer a
line, `bench/sim_agents.py` and `bench/roll_agents.py`) stops every client."""

from __future__ import annotations

import asyncio
import importlib.util
import io
import json
import os
import signal
import sys
import threading
from types import ModuleType

import pytest

from tests.support.processes import REPO_ROOT, free_port, port_open, wait_until


def _bench_module(name: str) -> ModuleType:
    """A module of bench/ loaded from its file (bench/ stays off sys.path: its `proxy` sets up Django)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO_ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


sim_agents = _bench_module("sim_agents")
stream_load = _bench_module("stream_load")


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.integration
def test_load_generators_see_every_chunk_of_every_stream_and_stop_their_process_groups(tmp_path):
    port = free_port()
    node = stream_load.start_node_server(port, tokens=5, interval_s=0.001)
    load = None
    try:
        wait_until(lambda: port_open(port), timeout=30, what="node server")
        load = stream_load.LoadGenerators(2)
        results, _elapsed = load.run(port, "node", streams=5, tokens=5)
        assert [(r.tokens, r.error) for r in results] == [(5, None)] * 5
        assert all(r.ttft is not None and len(r.gaps) <= 4 for r in results)
    finally:
        pids = load.pids if load else []
        if load:
            load.stop()
        os.killpg(node.pid, signal.SIGKILL)
        node.wait()
    assert all(_group_gone(pid) for pid in pids)


def test_simulated_agents_run_the_clients_blocking_calls_on_the_loop_thread():
    async def main() -> tuple[int, int]:
        asyncio.get_running_loop().set_default_executor(sim_agents.InlineExecutor())
        with pytest.raises(ZeroDivisionError):
            await asyncio.to_thread(lambda: 1 / 0)
        return threading.get_ident(), await asyncio.to_thread(threading.get_ident)

    before = threading.active_count()
    loop_thread, call_thread = asyncio.run(main())
    assert call_thread == loop_thread
    assert threading.active_count() == before


class _Client:
    """A simulated agent's tunnel client: runs until the stop event is set."""

    def __init__(self) -> None:
        self.stopped = False

    async def run(self, stop: asyncio.Event) -> int:
        await stop.wait()
        self.stopped = True
        return 0


@pytest.mark.parametrize("commands", [b"count\nbogus\nstop\ncount\n", b"count\nbogus\n"], ids=["stop", "eof"])
def test_simulated_agents_answer_each_command_then_stop_every_client(commands):
    clients = [_Client(), _Client()]
    read_fd, write_fd = os.pipe()
    os.write(write_fd, commands)
    os.close(write_fd)
    out = io.StringIO()

    def answer(line: str) -> dict[str, int] | None:
        return {"count": len(clients)} if line == "count" else None

    with os.fdopen(read_fd, "rb") as source:
        # a connect rate so high that the ramp starts every client at once, before any command is read
        asyncio.run(sim_agents.serve_commands(clients, answer, 1e9, source=source, out=out))
    answers = [json.loads(line) for line in out.getvalue().splitlines()]
    assert answers == [{"count": 2}, {"error": "unknown command 'bogus'"}, {"stopped": True}]
    assert all(client.stopped for client in clients)

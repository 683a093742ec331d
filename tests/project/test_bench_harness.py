"""The benchmarks' own harness: load generator processes that count every chunk and leave nothing behind,
and simulated agents whose blocking calls never start a thread."""

from __future__ import annotations

import asyncio
import importlib.util
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

"""Each command runs once: two deliveries of one idempotency key that race (the control plane's resend
after a reconnect and the dispatch of the same command) execute it once; the second is acknowledged as a
duplicate. The key is taken before the agent awaits anything (the journal look-up runs in a thread)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from agent import identity
from agent import protocol as p
from agent.config import AgentConfig
from agent.transport.tunnel import TunnelClient


class CountingRunner:
    """The runner seam (`RunnerLike`): counts executions; the journal look-up answers "never ran"."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self._lock = threading.Lock()

    def inventory(self, gpus: list[p.GpuInfo]) -> p.Inventory:
        return p.Inventory(gpus=gpus)

    def run(self, command: p.Command, progress) -> p.Result:  # type: ignore[no-untyped-def]
        with self._lock:
            self.runs.append(command.idempotency_key)
        return p.Result(command_id=command.command_id, data={})

    def completed(self, key: str) -> None:
        return None

    def proxy_ports(self) -> set[int]:
        return set()


def _client(tmp_path: Path) -> tuple[TunnelClient, CountingRunner, list[p.Frame]]:
    config = AgentConfig(
        control_plane_url="http://cp.invalid",
        node_id="00000000-0000-0000-0000-000000000001",
        tunnel_path=p.TUNNEL_PATH,
        heartbeat_interval_s=30,
        state_dir=str(tmp_path),
    )
    identity.write_private_key(identity.generate_key(), config.key_path)
    config.cert_path.write_text("certificate")
    config.ca_path.write_text("ca")
    runner = CountingRunner()
    client = TunnelClient(config, lambda mode, settings: runner)
    client.runner = runner
    sent: list[p.Frame] = []
    client._send = sent.append  # type: ignore[method-assign]
    return client, runner, sent


def _command(command_id: str, key: str) -> p.Command:
    return p.Command(command_id=command_id, idempotency_key=key, command_type="model.download", payload={})


def test_two_racing_deliveries_of_one_key_execute_it_once(tmp_path):
    client, runner, sent = _client(tmp_path)

    async def both() -> None:
        # The dispatch and the reconnect's resend: the same command, delivered twice in one loop turn.
        await asyncio.gather(client._on_command(_command("c-1", "k-1")), client._on_command(_command("c-1", "k-1")))

    asyncio.run(both())
    assert runner.runs == ["k-1"]
    acks = [f for f in sent if isinstance(f, p.Ack)]
    assert sorted(a.duplicate for a in acks) == [False, True]
    assert len([f for f in sent if isinstance(f, p.Result)]) == 1
    assert client._running_keys == set()


def test_many_racing_deliveries_of_several_keys_execute_each_once(tmp_path):
    client, runner, sent = _client(tmp_path)

    async def storm() -> None:
        deliveries = [client._on_command(_command(f"c-{i % 4}", f"k-{i % 4}")) for i in range(20)]
        await asyncio.gather(*deliveries)

    asyncio.run(storm())
    assert sorted(runner.runs) == ["k-0", "k-1", "k-2", "k-3"]
    assert len([f for f in sent if isinstance(f, p.Ack) and not f.duplicate]) == 4


def test_a_command_is_acknowledged_while_more_long_ones_run_than_the_default_thread_pool_holds(tmp_path):
    """Commands run on a thread pool of their own: the event loop's default one (at most 32 threads, 6 on two
    cores) kept the journal look-up before each acknowledgment waiting behind long commands."""
    client, runner, sent = _client(tmp_path)
    release = threading.Event()
    ran = runner.run

    def run(command: p.Command, progress) -> p.Result:  # type: ignore[no-untyped-def]
        if command.idempotency_key.startswith("long"):
            release.wait(120)  # an endpoint start waiting for its server, a download…
        return ran(command, progress)

    runner.run = run  # type: ignore[method-assign]

    def acked(command_id: str) -> bool:
        return any(isinstance(f, p.Ack) and f.command_id == command_id for f in sent)

    async def until(done) -> bool:  # type: ignore[no-untyped-def]
        for _ in range(3000):  # the old code answers only once a long command ends (never, here)
            if done():
                return True
            await asyncio.sleep(0.01)
        return False

    async def scenario() -> tuple[bool, bool]:
        long = [asyncio.ensure_future(client._on_command(_command(f"c-{i}", f"long-{i}"))) for i in range(33)]
        all_acked = await until(lambda: all(acked(f"c-{i}") for i in range(33)))
        short = asyncio.ensure_future(client._on_command(_command("c-short", "short")))
        answered = await until(lambda: acked("c-short") and "short" in runner.runs)
        release.set()
        await asyncio.gather(*long, short)
        return all_acked, answered

    assert asyncio.run(scenario()) == (True, True)  # every long one acknowledged; the short one answered
    assert sorted(runner.runs) == sorted(["short"] + [f"long-{i}" for i in range(33)])

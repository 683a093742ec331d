"""The agent reports its inventory after a command only when it changed since the last report."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent import identity
from agent import protocol as p
from agent.config import AgentConfig
from agent.transport.tunnel import TunnelClient


class Runner:
    """Inventory as the test sets it; commands succeed at once."""

    def __init__(self) -> None:
        self.models: list[p.CachedModel] = []

    def inventory(self, gpus: list[p.GpuInfo]) -> p.Inventory:
        return p.Inventory(gpus=gpus, models=list(self.models))

    def run(self, command: p.Command, progress) -> p.Result:  # type: ignore[no-untyped-def]
        return p.Result(command_id=command.command_id, data={})

    def completed(self, key: str) -> None:
        return None

    def proxy_ports(self) -> set[int]:
        return set()


def _client(tmp_path: Path) -> tuple[TunnelClient, Runner, list[p.Frame]]:
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
    runner = Runner()
    client = TunnelClient(config, lambda mode, settings: runner)
    client.runner = runner
    sent: list[p.Frame] = []
    client._send = sent.append  # type: ignore[method-assign]
    return client, runner, sent


def _command(key: str) -> p.Command:
    return p.Command(command_id=key, idempotency_key=key, command_type="model.download", payload={"model_id": "a/b"})


def test_unchanged_inventory_is_not_reported_again_a_changed_one_is(tmp_path):
    client, runner, sent = _client(tmp_path)
    client._reported_inventory = runner.inventory([])  # what the Hello carried

    asyncio.run(client._on_command(_command("k1")))
    assert [type(f) for f in sent] == [p.Ack, p.Result]  # nothing changed on the node: no report

    runner.models.append(p.CachedModel(model_id="a/b", revision="main", size_bytes=10, path="/cache/a/b"))
    sent.clear()
    asyncio.run(client._on_command(_command("k2")))
    assert [type(f) for f in sent] == [p.Ack, p.Result, p.InventoryReport]
    assert sent[-1].inventory.models[0].model_id == "a/b"

    sent.clear()
    asyncio.run(client._on_command(_command("k3")))
    assert [type(f) for f in sent] == [p.Ack, p.Result]

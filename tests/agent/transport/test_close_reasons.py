"""The agent learns why its tunnel closed: it logs the close code and reason, reconnects, and stops on 4403.

A stand-in control plane (a real websockets server) closes each connection in turn: by sending a message
over the agent's frame limit (so the agent itself closes with 1009), with 4400 and a reason, with 1012
(a server restarting: once logged as "unknown code"), then with 4403 and no `Revoked` frame. The agent runs
its real reconnect loop against it.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve

from agent import identity
from agent import protocol as p
from agent.config import AgentConfig
from agent.transport.tunnel import EXIT_REVOKED, ReconnectPolicy, TunnelClient


def _client(tmp_path: Path, port: int) -> TunnelClient:
    config = AgentConfig(
        control_plane_url=f"http://127.0.0.1:{port}",
        node_id="00000000-0000-0000-0000-000000000001",
        tunnel_path=p.TUNNEL_PATH,
        heartbeat_interval_s=30,
        state_dir=str(tmp_path),
    )
    identity.write_private_key(identity.generate_key(), config.key_path)
    config.cert_path.write_text("certificate")
    config.ca_path.write_text("ca")
    return TunnelClient(config, lambda mode, settings: None, policy=ReconnectPolicy(base_s=0.01, cap_s=0.01))  # type: ignore[arg-type,return-value]


@pytest.mark.asyncio
async def test_agent_logs_each_close_code_and_reason_reconnects_and_stops_on_4403(tmp_path, caplog):
    connections: list[str] = []

    async def control_plane(ws: ServerConnection) -> None:
        connections.append(ws.request.path if ws.request else "")
        if len(connections) == 1:
            await ws.send("x" * (p.MAX_FRAME_BYTES + 1))  # over the agent's limit: it closes with 1009
            await ws.wait_closed()
        elif len(connections) == 2:
            await ws.close(p.CLOSE_PROTOCOL_ERROR, "frame is not valid JSON")
        elif len(connections) == 3:
            await ws.close(1012, "server restarting")  # what a web process going down sends
        else:
            await ws.close(p.CLOSE_REVOKED, "certificate revoked")

    caplog.set_level(logging.INFO, logger="agent.tunnel")
    async with serve(control_plane, "127.0.0.1", 0, max_size=None) as server:
        port = server.sockets[0].getsockname()[1]
        code = await asyncio.wait_for(_client(tmp_path, port).run(), timeout=30)

    assert code == EXIT_REVOKED
    assert len(connections) == 4  # reconnected after 1009, 4400 and 1012, not after 4403
    messages: list[Any] = [r.getMessage() for r in caplog.records if r.name == "agent.tunnel"]
    assert any("this agent closed the tunnel: 1009 message too big" in m for m in messages), messages
    assert any("control plane closed the tunnel: 4400 bad frame: frame is not valid JSON" in m for m in messages), (
        messages
    )
    assert any("control plane closed the tunnel: 1012 service restart: server restarting" in m for m in messages), (
        messages
    )
    revoked = "node revoked by the control plane (certificate revoked): not reconnecting"
    assert any(revoked in m for m in messages), messages


@pytest.mark.asyncio
async def test_agent_refused_as_busy_before_the_challenge_waits_as_told_then_reconnects(tmp_path, caplog):
    """A control plane with too many handshakes in progress answers a Backoff instead of the challenge."""
    connections: list[str] = []

    async def control_plane(ws: ServerConnection) -> None:
        connections.append(ws.request.path if ws.request else "")
        if len(connections) == 1:
            busy = p.Backoff(retry_after_s=0.2, reason="control plane busy: too many agents connecting")
            await ws.send(p.encode(busy))
            await ws.close(p.CLOSE_BACKOFF, "busy")
        else:
            await ws.close(p.CLOSE_REVOKED, "certificate revoked")

    caplog.set_level(logging.INFO, logger="agent.tunnel")
    async with serve(control_plane, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        code = await asyncio.wait_for(_client(tmp_path, port).run(), timeout=30)

    assert code == EXIT_REVOKED
    assert len(connections) == 2  # came back after the back-off
    messages = [r.getMessage() for r in caplog.records if r.name == "agent.tunnel"]
    busy = "control plane asked to back off 0.2s: control plane busy: too many agents connecting"
    assert any(busy in m for m in messages), messages

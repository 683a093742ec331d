"""`SendUntilClosed`: after a close, or once the server says the peer is gone, the consumer's sends are
dropped (as daphne drops them) instead of failing the task that sent them (as uvicorn's `send` would)."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.tunnel.server_io import SendUntilClosed


class ClientDisconnected(OSError):
    """As uvicorn raises from `send` once the peer has gone."""


class ServerSend:
    """Stands for uvicorn's WebSocket `send`: records messages, raises once the peer is gone or after a close."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.peer_gone = False

    async def __call__(self, message: dict[str, Any]) -> None:
        if self.peer_gone:
            raise ClientDisconnected
        if self.sent and self.sent[-1]["type"] == "websocket.close":
            raise RuntimeError(f"Unexpected ASGI message '{message['type']}', after sending 'websocket.close'.")
        self.sent.append(message)


@pytest.mark.asyncio
async def test_messages_after_our_close_are_dropped():
    server = ServerSend()
    send = SendUntilClosed(server)
    await send({"type": "websocket.send", "text": "a"})
    await send({"type": "websocket.close", "code": 4403, "reason": "revoked"})
    await send({"type": "websocket.send", "text": "late heartbeat ack"})
    await send({"type": "websocket.close", "code": 1011})
    assert [m.get("text") or m["code"] for m in server.sent] == ["a", 4403]
    assert send.closed


@pytest.mark.asyncio
async def test_a_peer_that_left_ends_sending_without_an_error():
    server = ServerSend()
    send = SendUntilClosed(server)
    await send({"type": "websocket.send", "text": "a"})
    server.peer_gone = True
    await send({"type": "websocket.send", "text": "b"})  # no exception reaches the sender
    assert send.closed
    server.peer_gone = False
    await send({"type": "websocket.send", "text": "c"})
    assert [m["text"] for m in server.sent] == ["a"]


@pytest.mark.asyncio
async def test_other_failures_still_reach_the_sender():
    async def broken(message: dict[str, Any]) -> None:
        raise ValueError("not a message the server takes")

    with pytest.raises(ValueError, match="not a message"):
        await SendUntilClosed(broken)({"type": "websocket.send"})

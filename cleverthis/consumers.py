"""Project-level WebSocket consumers."""

from __future__ import annotations

from channels.generic.websocket import AsyncJsonWebsocketConsumer


class PingConsumer(AsyncJsonWebsocketConsumer):
    """Answers `{"type": "ping"}` with `{"type": "pong", "user": ...}`: a liveness probe for the ASGI stack."""

    async def connect(self) -> None:
        await self.accept()

    async def receive_json(self, content: dict, **kwargs: object) -> None:
        if content.get("type") == "ping":
            user = self.scope.get("user")
            name = user.get_username() if user is not None and user.is_authenticated else None
            await self.send_json({"type": "pong", "user": name})

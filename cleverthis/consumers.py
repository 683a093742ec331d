"""Project-level WebSocket consumers of the user-session stack: a liveness probe, the browsers' live socket."""

from __future__ import annotations

import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from fleet import browser_push
from tenancy.selectors import workspace_ids


class PingConsumer(AsyncJsonWebsocketConsumer):
    """Answers `{"type": "ping"}` with `{"type": "pong", "user": ...}`: a liveness probe for the ASGI stack."""

    async def connect(self) -> None:
        await self.accept()

    async def receive_json(self, content: dict, **kwargs: object) -> None:
        if content.get("type") == "ping":
            user = self.scope.get("user")
            name = user.get_username() if user is not None and user.is_authenticated else None
            await self.send_json({"type": "pong", "user": name})


LIVE_RENEW_S = 300.0  # a tab's renew re-reads its user's workspaces at most this often


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """A signed-in browser tab's socket: node changes of the user's workspaces, pushed as they commit.

    Authenticated with the session (the user-session stack in `cleverthis.asgi`); a visitor who is not
    signed in is refused (close 4401). It joins one group per workspace the user is a member of
    (`fleet.browser_push.workspace_group`) and forwards each `browser.nodes` message as a JSON frame
    `{"type": "nodes", "nodes": [...], "clusters": [...]}`. The browser sends `{"type": "renew"}` now and
    then: the memberships are read again (a workspace joined or left since) and the groups renewed, at
    most every LIVE_RENEW_S (channels_redis forgets a group member after a day). Idle otherwise: an
    open tab costs one socket and its group entries, no query and no timer on the server.
    """

    groups_joined: frozenset[str] = frozenset()
    renewed_at = 0.0
    user_group = ""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        self.user_group = browser_push.user_group(user.pk)
        await self.channel_layer.group_add(self.user_group, self.channel_name)
        await self._join()
        await self.accept()  # (once in its groups: what commits after the socket opens reaches it)

    async def _join(self) -> None:
        wanted = frozenset(browser_push.workspace_group(pk) for pk in await _workspace_ids(self.scope["user"]))
        for group in self.groups_joined - wanted:
            await self.channel_layer.group_discard(group, self.channel_name)
        for group in wanted:
            await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined = wanted
        self.renewed_at = time.monotonic()

    async def disconnect(self, code: int) -> None:
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)
        self.groups_joined = frozenset()
        if self.user_group:
            await self.channel_layer.group_discard(self.user_group, self.channel_name)

    async def receive_json(self, content: dict, **kwargs: object) -> None:
        if isinstance(content, dict) and content.get("type") == "renew":
            if time.monotonic() - self.renewed_at >= LIVE_RENEW_S:
                await self._join()

    async def browser_leave(self, message: dict) -> None:
        """The user was removed from a workspace: stop hearing it now (not at the next renew)."""
        group = browser_push.workspace_group(message["workspace"])
        if group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)
            self.groups_joined = self.groups_joined - {group}

    async def browser_nodes(self, message: dict) -> None:
        if browser_push.workspace_group(message.get("workspace")) not in self.groups_joined:
            return  # a workspace this tab has left (a message already on its way)
        await self.send_json({"type": "nodes", "nodes": message["nodes"], "clusters": message["clusters"]})


@database_sync_to_async
def _workspace_ids(user: object) -> list[object]:
    return list(workspace_ids(user=user).values_list("workspace_id", flat=True))

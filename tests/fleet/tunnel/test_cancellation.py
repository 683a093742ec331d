"""A cancelled channel-layer reader ends, whatever moment the cancel lands at.

The suite hung for 300 s at an event loop's shutdown (cancel every task, wait for all): this process's
tunnel inbox reader (`fleet.tunnel.local_tunnels._read_inbox`) was still in `channel_layer.receive()`.
redis-py writes each command through `asyncio.wait_for`, which on Python 3.11 returned instead of
raising when the cancel landed just after the command was written; channels_redis then popped again,
for good. `agent.asyncio_fixes.install()` (run when Django starts) replaces it with 3.12's `wait_for`,
and the inbox reader ends by itself if a library loses its cancel anyway.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.layers import get_channel_layer
from redis.asyncio.connection import AbstractConnection

from fleet.tunnel import local_tunnels

pytestmark = pytest.mark.asyncio

# Bound on waiting for a cancelled task to end (it ends within milliseconds; a lost cancel never does).
HANG_S = 30


@pytest.mark.parametrize("nth_command", [1, 2], ids=["after the clean-up script", "after the blocking pop"])
async def test_a_receive_cancelled_just_after_a_command_was_written_ends(monkeypatch, nth_command):
    layer = get_channel_layer()
    channel = await layer.new_channel()
    written = asyncio.Event()
    commands = 0
    send = AbstractConnection._send_packed_command

    async def send_and_tell(self: Any, command: Any) -> None:
        nonlocal commands
        await send(self, command)
        commands += 1
        if commands == nth_command:
            written.set()  # the cancel below lands before the receiving task resumes

    monkeypatch.setattr(AbstractConnection, "_send_packed_command", send_and_tell)
    receiving = asyncio.ensure_future(layer.receive(channel))
    await written.wait()
    receiving.cancel()
    await asyncio.wait({receiving}, timeout=HANG_S)
    try:
        assert receiving.cancelled(), "the cancel was lost: receive() went on reading"
    finally:
        if not receiving.done():  # leave no reader behind for the loop's shutdown
            monkeypatch.undo()
            receiving.cancel()
            await asyncio.wait({receiving}, timeout=HANG_S)


class _LayerThatLosesACancel:
    """A channel layer whose `receive` returns a message instead of raising when it is first cancelled."""

    def __init__(self) -> None:
        self.receives = 0

    async def receive(self, channel: str) -> dict[str, Any]:
        self.receives += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if self.receives > 1:
                raise
        return {"type": "nothing.for.the.inbox"}


async def test_the_inbox_reader_ends_even_when_the_layer_loses_its_cancel():
    layer = _LayerThatLosesACancel()
    reader = asyncio.ensure_future(local_tunnels._read_inbox(layer, "specific.x!inbox"))
    for _ in range(3):
        await asyncio.sleep(0)
    reader.cancel()
    await asyncio.wait({reader}, timeout=HANG_S)
    try:
        assert reader.cancelled()
        assert layer.receives == 1  # it did not go back to reading
    finally:
        if not reader.done():  # leave no reader behind for the loop's shutdown
            reader.cancel()
            await asyncio.wait({reader}, timeout=HANG_S)

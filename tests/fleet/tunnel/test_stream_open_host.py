"""The tunnel consumer forwards a stream's in-cluster `host` (a KubeRay head's Service) to the agent.

Driven through the real ASGI application with channels' WebsocketCommunicator over the real Redis
channel layer and PostgreSQL, as the other tunnel tests are.
"""

from __future__ import annotations

import pytest
from channels.layers import get_channel_layer

from agent import protocol as p
from fleet.proxy import stream_pipes
from fleet.tunnel.groups import node_group
from tests.fleet.tunnel.test_tunnel_bad_input import _authenticated, _frame, node_identity  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


async def _stream_open(comm) -> p.StreamOpen:
    while True:
        frame = await _frame(comm)
        if isinstance(frame, p.StreamOpen):
            return frame


@pytest.mark.asyncio
@pytest.mark.parametrize("host", ["train-1a2b3c4d-head-svc.cleverthis-workloads.svc", ""])
async def test_stream_open_carries_the_host_to_dial(node_identity, host):  # noqa: F811
    comm = await _authenticated(node_identity)
    opening = {"port": 8265, "window": 4096, "data": b"", "end": False}
    if host:
        opening["host"] = host
    message = {"type": "stream.open", "stream_id": 41, "pipe": stream_pipes.new_pipe_key(), **opening}

    await get_channel_layer().group_send(node_group(node_identity.node_id), message)

    frame = await _stream_open(comm)
    assert (frame.stream_id, frame.port, frame.window, frame.host) == (41, 8265, 4096, host)
    await comm.disconnect()

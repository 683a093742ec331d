"""Batch dispatch: a command to All nodes is one Celery task that claims the batch with one UPDATE.

The channel layer is the real Redis one: each node's group gets a real channel, and the messages
the batch sends are read back from it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from dataclasses import replace

import pytest
from asgiref.sync import async_to_sync
from channels.layers import channel_layers, get_channel_layer
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agent import protocol
from fleet import channels, services
from fleet.models import Command, CommandStatus, Node, NodeEvent
from fleet.tasks import dispatch_batch, dispatch_command

pytestmark = pytest.mark.django_db

PAYLOAD = {"model_id": "acme/tiny"}


def _listen(node: Node) -> str:
    """A plain (not process-specific) channel in the node's group, readable from any event loop."""
    channel = f"batch-test-{uuid.uuid4().hex}"
    async_to_sync(get_channel_layer().group_add)(channels.node_group(node.pk), channel)
    return channel


def _received(channel: str) -> list[dict]:
    layer = channel_layers.make_backend("default")  # a fresh layer: its receive buffers bind to this loop

    async def drain() -> list[dict]:
        out = []
        while True:
            try:
                out.append(await asyncio.wait_for(layer.receive(channel), timeout=0.3))
            except TimeoutError:
                return out

    return async_to_sync(drain)()


def test_all_nodes_dispatch_enqueues_one_batch_task_single_node_one_command_task(
    cluster, register_node, owner, django_capture_on_commit_callbacks, monkeypatch
):
    nodes = [register_node(cluster, f"n{i}") for i in range(3)]
    batches: list[str] = []
    singles: list[str] = []
    monkeypatch.setattr(dispatch_batch, "delay", batches.append)
    monkeypatch.setattr(dispatch_command, "delay", singles.append)
    with django_capture_on_commit_callbacks(execute=True):
        commands = services.command_dispatch(
            actor=owner, cluster=cluster, command_type="model.download", payload=PAYLOAD
        )
    assert batches == [str(commands[0].batch_id)]
    assert singles == []
    with django_capture_on_commit_callbacks(execute=True):
        (one,) = services.command_dispatch(
            actor=owner, cluster=cluster, command_type="model.download", payload=PAYLOAD, node=nodes[0]
        )
    assert singles == [str(one.pk)]
    assert len(batches) == 1


def test_batch_claims_connected_nodes_in_one_update_and_sends_each_once(cluster, register_node, owner):
    nodes = [register_node(cluster, f"n{i}") for i in range(4)]
    Node.objects.filter(pk=nodes[3].pk).update(connected=False)  # online, but its tunnel just dropped
    listening = {n.pk: _listen(n) for n in nodes}
    commands = services.command_dispatch(actor=owner, cluster=cluster, command_type="model.download", payload=PAYLOAD)
    by_node = {c.node_id: c for c in commands}

    with CaptureQueriesContext(connection) as ctx:
        assert services.command_batch_claim_and_send(batch_id=commands[0].batch_id) == 3
    updates = [q["sql"] for q in ctx.captured_queries if q["sql"].lstrip().upper().startswith("UPDATE")]
    assert len(updates) == 1  # one conditional UPDATE … RETURNING for the whole batch

    for node in nodes[:3]:
        row = Command.objects.get(pk=by_node[node.pk].pk)
        # the frame rides along (no read per node in the consumer), exactly as the consumer would build it
        (message,) = _received(listening[node.pk])
        assert message["command_id"] == str(row.pk)
        sent = protocol.decode(message["frame"])
        assert sent == replace(channels.command_frame(row), id=sent.id)
        assert (row.status, row.attempts) == (CommandStatus.DISPATCHED, 1)
    assert _received(listening[nodes[3].pk]) == []
    assert Command.objects.get(pk=by_node[nodes[3].pk].pk).status == CommandStatus.QUEUED
    assert NodeEvent.objects.filter(kind="command.dispatched", command__batch_id=commands[0].batch_id).count() == 3

    # a second run (duplicate task) sends nothing again; the reconnecting node gets its own on hello
    assert services.command_batch_claim_and_send(batch_id=commands[0].batch_id) == 0
    assert all(_received(listening[n.pk]) == [] for n in nodes)
    assert services.command_pending_for_node(node=nodes[3]) == [by_node[nodes[3].pk]]


def test_redelivered_batch_resends_only_stale_unacknowledged_claims(cluster, register_node, owner):
    nodes = [register_node(cluster, f"n{i}") for i in range(3)]
    listening = {n.pk: _listen(n) for n in nodes}
    commands = services.command_dispatch(actor=owner, cluster=cluster, command_type="model.download", payload=PAYLOAD)
    assert services.command_batch_claim_and_send(batch_id=commands[0].batch_id) == 3
    for channel in listening.values():
        _received(channel)
    long_ago = timezone.now() - dt.timedelta(seconds=300)
    stale, acked, fresh = commands
    Command.objects.filter(pk=stale.pk).update(dispatched_at=long_ago)
    Command.objects.filter(pk=acked.pk).update(dispatched_at=long_ago, status="running", acked_at=timezone.now())
    assert services.command_batch_claim_and_send(batch_id=commands[0].batch_id) == 1
    (message,) = _received(listening[stale.node_id])
    assert message["command_id"] == str(stale.pk)
    assert protocol.decode(message["frame"]).command_id == str(stale.pk)
    assert _received(listening[acked.node_id]) == []
    assert _received(listening[fresh.node_id]) == []
    assert Command.objects.get(pk=stale.pk).attempts == 2


def test_batch_with_secrets_sends_only_the_command_id_through_redis(cluster, register_node, owner):
    nodes = [register_node(cluster, f"s{i}") for i in range(2)]
    listening = {n.pk: _listen(n) for n in nodes}
    payload = {"name": "web", "image": "registry.local/web:1", "registry_password": "hunter2"}
    commands = services.command_dispatch(actor=owner, cluster=cluster, command_type="container.create", payload=payload)
    assert services.command_batch_claim_and_send(batch_id=commands[0].batch_id) == 2
    for command in commands:
        assert _received(listening[command.node_id]) == [channels.command_message(command.pk)]  # no "frame"


def test_batched_acks_move_every_command_with_three_queries_and_isolate_bad_ones(cluster, register_node, owner):
    nodes = [register_node(cluster, f"a{i}") for i in range(5)]
    commands = services.command_dispatch(actor=owner, cluster=cluster, command_type="model.download", payload=PAYLOAD)
    dispatch_batch(str(commands[0].batch_id))
    by_node = {c.node_id: c for c in commands}
    done = by_node[nodes[4].pk]
    services.command_record_ack(node=nodes[4], command_id=done.pk)
    services.command_record_result(node=nodes[4], command_id=done.pk, data={})
    acks = [(n.pk, str(by_node[n.pk].pk), False) for n in nodes[:3]]
    acks += [
        (nodes[3].pk, str(by_node[nodes[0].pk].pk), False),  # another node's command
        (nodes[3].pk, "not-a-uuid", False),
        (nodes[4].pk, str(done.pk), False),  # already succeeded
        (nodes[0].pk, str(by_node[nodes[0].pk].pk), True),  # the same ack twice in one batch
    ]
    with CaptureQueriesContext(connection) as ctx:
        outcomes = services.command_record_acks(acks=acks)
    statements = [q["sql"].split()[0].upper() for q in ctx.captured_queries]
    assert [s for s in statements if s in ("SELECT", "UPDATE", "INSERT")] == ["SELECT", "UPDATE", "INSERT"]
    assert [o.status for o in outcomes[:3]] == [CommandStatus.RUNNING] * 3
    assert outcomes[3] is None
    assert outcomes[6] is None
    assert "command_id" in outcomes[4].message_dict
    assert isinstance(outcomes[5], services.IllegalTransition)
    for node in nodes[:3]:
        row = Command.objects.get(pk=by_node[node.pk].pk)
        assert row.status == CommandStatus.RUNNING
        assert row.acked_at is not None
        assert NodeEvent.objects.filter(command=row, kind="command.running").count() == 1
    assert Command.objects.get(pk=by_node[nodes[3].pk].pk).status == CommandStatus.DISPATCHED
    assert Command.objects.get(pk=done.pk).status == CommandStatus.SUCCEEDED

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
from fleet import enqueue, groups, services
from fleet.models import Command, CommandStatus, Node, NodeEvent
from fleet.tasks import dispatch_batch
from fleet.tunnel import local_tunnels

pytestmark = pytest.mark.django_db

PAYLOAD = {"model_id": "acme/tiny"}


def _listen(node: Node) -> str:
    """A plain (not process-specific) channel in the node's group, readable from any event loop."""
    channel = f"batch-test-{uuid.uuid4().hex}"
    async_to_sync(get_channel_layer().group_add)(groups.node_group(node.pk), channel)
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
    by_name = {enqueue.DISPATCH_BATCH: batches.append, enqueue.DISPATCH_COMMAND: singles.append}
    monkeypatch.setattr(enqueue, "send", lambda name, *args: by_name[name](*args))
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
        assert sent == replace(groups.command_frame(row), id=sent.id)
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


@pytest.mark.parametrize(
    "secret", [{"registry_password": "hunter2"}, {"env": {"HF_TOKEN": "hunter2"}}], ids=["password", "env"]
)
def test_batch_with_secrets_sends_only_the_command_id_through_redis(cluster, register_node, owner, secret):
    nodes = [register_node(cluster, f"s{i}") for i in range(2)]
    listening = {n.pk: _listen(n) for n in nodes}
    payload = {"name": "web", "image": "registry.local/web:1", **secret}
    commands = services.command_dispatch(actor=owner, cluster=cluster, command_type="container.create", payload=payload)
    assert services.command_batch_claim_and_send(batch_id=commands[0].batch_id) == 2
    for command in commands:
        assert _received(listening[command.node_id]) == [groups.command_message(command.pk)]  # no "frame"


def test_batched_reports_use_one_select_one_update_per_kind_one_insert_and_isolate_bad_ones(
    cluster, register_node, owner
):
    nodes = [register_node(cluster, f"a{i}") for i in range(6)]
    commands = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="container.stop", payload={"container": "web"}
    )
    dispatch_batch(str(commands[0].batch_id))
    by_node = {c.node_id: c for c in commands}
    done = by_node[nodes[4].pk]
    services.command_record_ack(node=nodes[4], command_id=done.pk)
    services.command_record_result(node=nodes[4], command_id=done.pk, data={})
    first, second, third, fourth, _, sixth = (by_node[n.pk] for n in nodes)
    report = services.CommandReport
    reports = [
        report.ack(nodes[0].pk, str(first.pk)),
        report.ack(nodes[1].pk, str(second.pk)),
        report.ack(nodes[2].pk, str(third.pk)),
        report.ack(nodes[3].pk, str(first.pk)),  # another node's command
        report.ack(nodes[3].pk, "not-a-uuid"),
        report.ack(nodes[4].pk, str(done.pk)),  # already succeeded
        report.ack(nodes[0].pk, str(first.pk), duplicate=True),  # the same ack twice in one batch
        report.result(nodes[1].pk, str(second.pk), {"ok": 1}),  # ack and result of one command, in order
        report.error(nodes[5].pk, str(sixth.pk), code="not_found", message="no such container {x}"),
    ]
    with CaptureQueriesContext(connection) as ctx:
        outcomes = services.command_record_reports(reports=reports)
    statements = [q["sql"].split()[0].upper() for q in ctx.captured_queries]
    data_statements = [s for s in statements if s in ("SELECT", "UPDATE", "INSERT")]
    # in the lock order (docs/architecture.md): the endpoints the hooks follow up, the nodes (key share),
    # the commands; one UPDATE each for running / succeeded / failed, one INSERT of all events, and the
    # container hooks' own reads for the two finished commands
    assert data_statements[:7] == ["SELECT", "SELECT", "SELECT", "UPDATE", "UPDATE", "UPDATE", "INSERT"]
    assert [o.status for o in outcomes[:3]] == [CommandStatus.RUNNING, CommandStatus.SUCCEEDED, CommandStatus.RUNNING]
    assert outcomes[3] is None
    assert outcomes[6] is None
    assert "command_id" in outcomes[4].message_dict
    assert isinstance(outcomes[5], services.IllegalTransition)
    assert Command.objects.get(pk=first.pk).status == CommandStatus.RUNNING
    assert Command.objects.get(pk=third.pk).status == CommandStatus.RUNNING
    finished = Command.objects.get(pk=second.pk)
    assert (finished.status, finished.result) == (CommandStatus.SUCCEEDED, {"ok": 1})
    assert finished.acked_at is not None
    assert finished.finished_at is not None
    failed = Command.objects.get(pk=sixth.pk)
    assert (failed.status, failed.error_code, failed.error_message) == ("failed", "not_found", "no such container {x}")
    kinds = list(NodeEvent.objects.filter(command=second).order_by("created_at", "id").values_list("kind", flat=True))
    assert kinds == ["command.queued", "command.dispatched", "command.running", "command.succeeded"]
    assert NodeEvent.objects.get(command=sixth, kind="command.failed").message == (
        "container.stop failed: not_found: no such container {x}"
    )
    assert Command.objects.get(pk=fourth.pk).status == CommandStatus.DISPATCHED
    assert Command.objects.get(pk=done.pk).status == CommandStatus.SUCCEEDED


def test_heartbeats_of_many_nodes_are_one_update_and_bring_connected_offline_nodes_online(cluster, register_node):
    from agent import protocol as p

    nodes = [register_node(cluster, f"h{i}") for i in range(3)]
    Node.objects.filter(pk=nodes[2].pk).update(status="offline", memory_total_mb=2048)
    gpu = p.GpuInfo(index=0, name="H100", memory_total_mb=81920, memory_used_mb=1024, utilization_percent=40.0)
    beats = [
        (nodes[0].pk, p.Heartbeat(cpu_percent=10.0, memory_percent=20.0, memory_used_mb=100, memory_total_mb=1000)),
        (nodes[1].pk, p.Heartbeat(cpu_percent=30.0, memory_percent=40.0, memory_used_mb=-5, gpus=[gpu])),
        (nodes[2].pk, p.Heartbeat(cpu_percent=50.0, memory_percent=60.0, memory_used_mb=300, memory_total_mb=0)),
    ]
    with CaptureQueriesContext(connection) as ctx:
        services.node_record_heartbeats(beats=beats)
    # one UPDATE for all; the one node that came back online gets its event line (a rare case)
    assert [q["sql"].split()[0] for q in ctx.captured_queries] == ["UPDATE", "INSERT"]
    assert NodeEvent.objects.get(node=nodes[2], kind="online").message == "Heartbeat received; status → online"
    with CaptureQueriesContext(connection) as ctx:
        services.node_record_heartbeats(beats=beats[:2])
    assert len(ctx.captured_queries) == 1
    first, second, third = (Node.objects.get(pk=n.pk) for n in nodes)
    assert (first.cpu_percent, first.memory_used_mb, first.memory_total_mb) == (10.0, 100, 1000)
    assert (second.memory_used_mb, second.vram_total_mb, second.vram_used_mb) == (0, 81920, 1024)
    assert second.gpu_utilization_percent == 40.0
    assert second.gpus[0]["name"] == "H100"
    assert first.gpus == nodes[0].gpus  # no GPUs in the beat: GPU columns untouched
    assert (third.status, third.memory_total_mb) == ("online", 2048)  # offline → online; 0 total kept
    assert third.last_heartbeat_at > nodes[2].last_heartbeat_at


def test_batch_sends_one_message_per_process_inbox_and_group_messages_for_the_rest(cluster, register_node, owner):
    nodes = [register_node(cluster, f"i{i}") for i in range(5)]
    inbox_a, inbox_b = f"inbox-a-{uuid.uuid4().hex}", f"inbox-b-{uuid.uuid4().hex}"
    Node.objects.filter(pk__in=[nodes[0].pk, nodes[1].pk, nodes[2].pk]).update(tunnel_inbox=inbox_a)
    Node.objects.filter(pk=nodes[3].pk).update(tunnel_inbox=inbox_b)
    unknown = _listen(nodes[4])  # no inbox recorded (e.g. connected before the upgrade): its node group
    commands = services.command_dispatch(actor=owner, cluster=cluster, command_type="model.download", payload=PAYLOAD)
    by_node = {c.node_id: c for c in commands}
    assert services.command_batch_claim_and_send(batch_id=commands[0].batch_id) == 5

    (to_a,) = _received(inbox_a)
    (to_b,) = _received(inbox_b)
    assert to_a["type"] == groups.INBOX_COMMANDS
    assert {node_id for node_id, _ in to_a["commands"]} == {str(n.pk) for n in nodes[:3]}
    assert [m["command_id"] for _, m in to_b["commands"]] == [str(by_node[nodes[3].pk].pk)]
    for node_id, message in to_a["commands"] + to_b["commands"]:
        assert protocol.decode(message["frame"]).command_id == str(by_node[uuid.UUID(node_id)].pk)
    (direct,) = _received(unknown)
    assert direct["command_id"] == str(by_node[nodes[4].pk].pk)


def test_inbox_hands_commands_to_tunnels_of_this_process_and_the_rest_to_their_node_groups(cluster, register_node):
    here, moved = register_node(cluster, "here"), register_node(cluster, "moved")
    got: list[dict] = []

    class Tunnel:
        async def node_command(self, message: dict) -> None:
            got.append(message)

    listening = _listen(moved)
    tunnel = Tunnel()
    local_tunnels.add(here.pk, tunnel)
    try:
        layer = channel_layers.make_backend("default")
        commands = [
            (here.pk, groups.command_message(uuid.uuid4())),
            (moved.pk, groups.command_message(uuid.uuid4())),
        ]
        async_to_sync(local_tunnels.deliver_commands)(layer, groups.inbox_commands_message(commands)["commands"])
    finally:
        local_tunnels.discard(here.pk, tunnel)
    assert got == [commands[0][1]]
    assert _received(listening) == [commands[1][1]]
    assert local_tunnels.get(here.pk) is None


def test_process_inbox_is_read_while_tunnel_channels_of_the_same_process_wait_for_messages(cluster, register_node):
    """The inbox shares the layer's per-process receive loop with the consumers' own groups."""
    node = register_node(cluster, "inbox-reader")
    got: list[dict] = []

    class Tunnel:
        async def node_command(self, message: dict) -> None:
            got.append(message)

    async def scenario() -> None:
        from channels.layers import get_channel_layer

        layer = get_channel_layer()
        consumer_channel = await layer.new_channel()  # like a tunnel consumer waiting on its channel
        waiting = asyncio.ensure_future(layer.receive(consumer_channel))
        await asyncio.sleep(0.1)
        inbox = await local_tunnels.inbox()
        tunnel = Tunnel()
        local_tunnels.add(node.pk, tunnel)
        try:
            message = groups.command_message(uuid.uuid4())
            await layer.send(inbox, groups.inbox_commands_message([(node.pk, message)]))
            for _ in range(100):
                if got:
                    break
                await asyncio.sleep(0.05)
        finally:
            local_tunnels.discard(node.pk, tunnel)
            waiting.cancel()
        assert got == [message]

    layer_backup = channel_layers.backends.pop("default", None)  # a layer bound to this test's loop
    try:
        async_to_sync(scenario)()
    finally:
        channel_layers.backends.pop("default", None)
        if layer_backup is not None:
            channel_layers.backends["default"] = layer_backup


def test_sweeper_resends_what_never_reached_a_connected_node_and_leaves_the_rest(cluster, register_node, owner):
    from fleet.tasks import resend_stuck_commands

    up, down = register_node(cluster, "up"), register_node(cluster, "down")
    Node.objects.filter(pk=down.pk).update(connected=False)
    listening = _listen(up)
    long_ago = timezone.now() - dt.timedelta(seconds=300)

    def command(node: Node, **fields) -> Command:
        (row,) = services.command_dispatch(
            actor=owner, cluster=cluster, command_type="model.download", payload=PAYLOAD, node=node
        )
        Command.objects.filter(pk=row.pk).update(**fields)
        return row

    lost_task = command(up, created_at=long_ago)  # its dispatch task died with the broker
    lost_send = command(up, status="dispatched", dispatched_at=long_ago, created_at=long_ago)
    fresh = command(up)  # its task may still be on its way
    acked = command(up, status="running", dispatched_at=long_ago, acked_at=long_ago, created_at=long_ago)
    offline = command(down, created_at=long_ago)  # delivered on reconnect instead

    assert resend_stuck_commands() == 2
    assert sorted(m["command_id"] for m in _received(listening)) == sorted([str(lost_task.pk), str(lost_send.pk)])
    assert Command.objects.get(pk=lost_task.pk).status == CommandStatus.DISPATCHED
    assert Command.objects.get(pk=lost_send.pk).attempts == 1
    assert Command.objects.get(pk=fresh.pk).status == CommandStatus.QUEUED
    assert Command.objects.get(pk=acked.pk).status == CommandStatus.RUNNING
    assert Command.objects.get(pk=offline.pk).status == CommandStatus.QUEUED
    assert resend_stuck_commands() == 0  # just claimed: not stale yet


def test_sweeper_fails_a_command_its_connected_node_never_acknowledges_with_a_reason(
    cluster, register_node, owner, settings, client
):
    """A node that looks connected but never acknowledges (its tunnel is a zombie): the command is sent
    again COMMAND_MAX_ATTEMPTS times in all, then fails as `undelivered`, visible in the Commands tab."""
    from fleet.tasks import resend_stuck_commands

    settings.COMMAND_MAX_ATTEMPTS = 3
    node = register_node(cluster, "zombie")
    listening = _listen(node)
    (command,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="model.download", payload=PAYLOAD, node=node
    )
    (acked,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="model.download", payload=PAYLOAD, node=node
    )

    def age() -> None:
        long_ago = timezone.now() - dt.timedelta(seconds=300)
        Command.objects.filter(pk__in=[command.pk, acked.pk]).update(created_at=long_ago)
        Command.objects.filter(pk__in=[command.pk, acked.pk], status="dispatched").update(dispatched_at=long_ago)

    for attempt in (1, 2, 3):
        age()
        assert resend_stuck_commands() == (2 if attempt == 1 else 1)
        assert Command.objects.get(pk=command.pk).attempts == attempt
        if attempt == 1:
            services.command_record_ack(node=node, command_id=acked.pk)  # this one arrived
    assert len([m for m in _received(listening) if m["command_id"] == str(command.pk)]) == 3

    age()
    assert resend_stuck_commands() == 0
    failed = Command.objects.get(pk=command.pk)
    assert (failed.status, failed.error_code, failed.attempts) == (CommandStatus.FAILED, "undelivered", 3)
    assert "never acknowledged" in failed.error_message
    assert "sent 3 times" in failed.error_message
    assert NodeEvent.objects.filter(command=command, kind="command.failed").exists()
    assert Command.objects.get(pk=acked.pk).status == CommandStatus.RUNNING  # acknowledged: never failed so
    assert not _received(listening)  # and nothing sent again

    client.force_login(owner)
    page = client.get(f"/compute/clusters/{cluster.pk}/commands/").content.decode()
    assert "undelivered: The node never acknowledged this command" in page

"""Command dispatch, the claim task, and the records the tunnel consumer writes."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.core.exceptions import PermissionDenied, ValidationError

from agent import protocol
from fleet import enqueue, groups, services, signals
from fleet.models import Command, CommandStatus, Node, NodeEvent
from fleet.payloads import MASK
from fleet.tasks import dispatch_command
from kernel.exceptions import IllegalTransition

pytestmark = pytest.mark.django_db

CREATE = {"image": "nginx:1.27", "name": "web", "ports": [{"container_port": 80}]}


def test_dispatch_to_all_online_nodes_one_row_each_one_batch_task_on_commit(
    cluster, register_node, owner, django_capture_on_commit_callbacks, monkeypatch
):
    a = register_node(cluster, "a")
    b = register_node(cluster, "b")
    register_node(cluster, "offline", online=False)
    sent: list[str] = []
    monkeypatch.setattr(
        enqueue, "send", lambda name, batch_id: sent.append(batch_id) if name == enqueue.DISPATCH_BATCH else None
    )
    with django_capture_on_commit_callbacks() as callbacks:
        commands = services.command_dispatch(
            actor=owner, cluster=cluster, command_type="container.create", payload=CREATE
        )
        assert sent == []  # nothing leaves before commit
    assert {c.node_id for c in commands} == {a.pk, b.pk}
    assert len({c.batch_id for c in commands}) == 1
    assert len({c.idempotency_key for c in commands}) == 2
    assert all(c.status == CommandStatus.QUEUED for c in commands)
    assert commands[0].payload["image"] == "nginx:1.27"
    assert commands[0].payload["ports"] == [{"container_port": 80, "host_port": 0, "protocol": "tcp"}]
    for cb in callbacks:
        cb()
    assert sent == [str(commands[0].batch_id)]  # one task for the whole batch
    assert NodeEvent.objects.filter(kind="command.queued").count() == 2


def test_single_offline_node_gets_a_queued_command_delivered_on_reconnect(cluster, register_node, owner):
    node = register_node(cluster, online=False)
    (command,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="container.stop", payload={"container": "web"}, node=node
    )
    assert dispatch_command(str(command.pk)) is False  # not connected: stays queued
    command.refresh_from_db()
    assert command.status == CommandStatus.QUEUED
    assert command.attempts == 0
    assert services.command_pending_for_node(node=node) == [command]


def test_registry_password_is_kept_out_of_payload_and_encrypted(node, cluster, owner):
    (command,) = services.command_dispatch(
        actor=owner,
        cluster=cluster,
        command_type="container.create",
        payload={**CREATE, "registry_username": "u", "registry_password": "s3cret"},
        node=node,
    )
    assert "registry_password" not in command.payload
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT secrets FROM fleet_command WHERE id = %s", [command.pk])
        assert "s3cret" not in cursor.fetchone()[0]
    assert Command.objects.get(pk=command.pk).wire_payload()["registry_password"] == "s3cret"


def _stored(command_id) -> str:
    """The command's row as PostgreSQL holds it (payload and encrypted secrets)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT payload::text || secrets FROM fleet_command WHERE id = %s", [command_id])
        return cursor.fetchone()[0]


def test_env_values_are_encrypted_at_rest_masked_in_the_payload_and_reach_the_agent(node, cluster, owner):
    (command,) = services.command_dispatch(
        actor=owner,
        cluster=cluster,
        command_type="container.create",
        payload={**CREATE, "env": {"HF_TOKEN": "hf_live_123", "MODE": "prod-mode"}},
        node=node,
    )
    assert command.payload["env"] == {"HF_TOKEN": MASK, "MODE": MASK}
    stored = _stored(command.pk)
    assert "hf_live_123" not in stored
    assert "prod-mode" not in stored
    assert "HF_TOKEN" in stored
    frame = protocol.decode(protocol.encode(groups.command_frame(Command.objects.get(pk=command.pk))))
    assert frame.payload["env"] == {"HF_TOKEN": "hf_live_123", "MODE": "prod-mode"}
    assert "secret_fields" not in frame.payload
    protocol.parse_payload(frame.command_type, frame.payload)


def test_fields_marked_secret_are_encrypted_and_masked(node, cluster, owner):
    (command,) = services.command_dispatch(
        actor=owner,
        cluster=cluster,
        command_type="container.create",
        payload={**CREATE, "command": ["serve", "--api-key", "sk-777"], "secret_fields": ["command"]},
        node=node,
    )
    assert command.payload["command"] == [MASK, MASK, MASK]
    assert command.payload["secret_fields"] == ["command"]
    assert "sk-777" not in _stored(command.pk)
    wire = Command.objects.get(pk=command.pk).wire_payload()
    assert wire["command"] == ["serve", "--api-key", "sk-777"]
    assert "secret_fields" not in wire


def test_ray_job_env_vars_are_secret_the_rest_of_runtime_env_is_not(node, cluster, owner):
    payload = {
        "cluster_id": "c1",
        "member_id": "m1",
        "submission_id": "job-1",
        "entrypoint": "python train.py",
        "runtime_env": {"pip": ["torch"], "env_vars": {"WANDB_API_KEY": "wb-secret-9"}},
    }
    # raymgr's path: operators cannot send ray.* (tests/raymgr/test_owned_commands.py)
    (command,) = services.command_queue(
        actor=owner, cluster=cluster, command_type="ray.job.submit", payload=payload, node=node
    )
    assert command.payload["runtime_env"] == {"pip": ["torch"], "env_vars": {"WANDB_API_KEY": MASK}}
    assert "wb-secret-9" not in _stored(command.pk)
    assert Command.objects.get(pk=command.pk).wire_payload()["runtime_env"] == payload["runtime_env"]


@pytest.mark.parametrize(
    ("marks", "message"),
    [
        (["image"], "Cannot mark image secret"),
        (["nope"], "Cannot mark nope secret"),
        ("command", "Must be a list"),
    ],
)
def test_bad_secret_marks_are_field_errors(node, cluster, owner, marks, message):
    with pytest.raises(ValidationError) as caught:
        services.command_dispatch(
            actor=owner,
            cluster=cluster,
            command_type="container.create",
            payload={**CREATE, "secret_fields": marks},
            node=node,
        )
    assert message in " ".join(caught.value.message_dict["payload.secret_fields"])
    assert not Command.objects.exists()


def test_plaintext_env_of_older_rows_is_moved_into_the_encrypted_secrets(node, cluster, owner):
    import importlib

    from django.apps import apps

    from fleet.workloads.models import Container

    migration = importlib.import_module("fleet.migrations.0007_encrypt_workload_env")
    old = Command.objects.create(
        node=node,
        cluster=cluster,
        command_type="container.create",
        payload={**CREATE, "env": {"HF_TOKEN": "hf_old_456"}},
        secrets='{"registry_password": "pw-old"}',
        idempotency_key="old-1",
    )
    row = Container.objects.create(
        node=node, cluster=cluster, name="web", image="nginx", spec=old.payload, created_by_command=old
    )
    migration.encrypt_env(apps, None)
    old.refresh_from_db()
    row.refresh_from_db()
    assert old.payload["env"] == {"HF_TOKEN": MASK}
    assert row.spec["env"] == {"HF_TOKEN": MASK}
    assert "hf_old_456" not in _stored(old.pk)
    wire = old.wire_payload()
    assert (wire["env"], wire["registry_password"]) == ({"HF_TOKEN": "hf_old_456"}, "pw-old")
    migration.encrypt_env(apps, None)  # a second run changes nothing
    old.refresh_from_db()
    assert old.wire_payload() == wire


def test_only_operators_dispatch(cluster, node, workspace, member_of):
    for role in ("member", "viewer"):
        with pytest.raises(PermissionDenied):
            services.command_dispatch(
                actor=member_of(workspace, role), cluster=cluster, command_type="container.create", payload=CREATE
            )
    assert not Command.objects.exists()


@pytest.mark.parametrize(
    ("command_type", "payload", "field"),
    [
        ("container.reboot", {}, "command_type"),
        ("container.create", {"name": "web"}, "payload.image"),
        ("container.create", {**CREATE, "gpus": "two"}, "payload.gpus"),
        ("container.create", {**CREATE, "image": "x" * 600}, "payload.image"),
        ("container.create", {**CREATE, "surprise": 1}, "payload.surprise"),
        ("container.create", "not an object", "payload"),
        ("model.download", {"model_id": "not a model id!"}, "payload.model_id"),
        ("endpoint.start", {"endpoint_id": "e1", "model_id": "org/m", "port": 70000}, "payload.port"),
    ],
)
def test_bad_payloads_are_field_errors(cluster, node, owner, command_type, payload, field):
    with pytest.raises(ValidationError) as info:
        services.command_dispatch(actor=owner, cluster=cluster, command_type=command_type, payload=payload)
    assert field in info.value.message_dict
    assert not Command.objects.exists()


def test_node_of_another_cluster_and_cordoned_nodes(cluster, other_cluster, register_node, node, owner):
    foreign = register_node(other_cluster, "foreign")
    with pytest.raises(ValidationError) as info:
        services.command_dispatch(
            actor=owner, cluster=cluster, command_type="container.stop", payload={"container": "x"}, node=foreign
        )
    assert "node_id" in info.value.message_dict
    services.node_cordon(node=node, actor=owner)
    with pytest.raises(IllegalTransition, match="cordoned"):
        services.command_dispatch(
            actor=owner, cluster=cluster, command_type="container.create", payload=CREATE, node=node
        )
    # Stopping work on a cordoned node is still allowed.
    services.command_dispatch(
        actor=owner, cluster=cluster, command_type="container.stop", payload={"container": "x"}, node=node
    )
    with pytest.raises(IllegalTransition, match="No online nodes"):
        services.command_dispatch(actor=owner, cluster=cluster, command_type="container.create", payload=CREATE)


def test_task_claims_once_and_sends_to_the_node_group(node, cluster, owner):
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(groups.node_group(node.pk), channel)
    (command,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="model.download", payload={"model_id": "org/model"}, node=node
    )
    assert dispatch_command(str(command.pk)) is True
    assert dispatch_command(str(command.pk)) is False  # second call: already claimed, no-op
    command.refresh_from_db()
    assert command.status == CommandStatus.DISPATCHED
    assert command.attempts == 1
    assert command.dispatched_at
    assert async_to_sync(layer.receive)(channel) == {"type": "node.command", "command_id": str(command.pk)}
    # Gone rows exit cleanly.
    Command.objects.filter(pk=command.pk).delete()
    assert dispatch_command(str(command.pk)) is False


def _dispatched(node: Node, cluster, owner) -> Command:
    (command,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="container.start", payload={"container": "web"}, node=node
    )
    dispatch_command(str(command.pk))
    return command


def test_ack_progress_result_lifecycle_with_duplicates_ignored(node, cluster, owner):
    command = _dispatched(node, cluster, owner)
    assert services.command_pending_for_node(node=node) == [command]
    assert services.command_record_ack(node=node, command_id=command.pk).status == CommandStatus.RUNNING
    assert services.command_record_ack(node=node, command_id=command.pk) is None  # exact duplicate
    # still re-sent on a reconnect until its outcome arrives (the outcome may die with a socket)
    assert services.command_pending_for_node(node=node) == [command]
    services.command_record_progress(node=node, command_id=command.pk, message="pulling", percent=50.0)
    done = services.command_record_result(node=node, command_id=command.pk, data={"container_id": "abc"})
    assert done.status == CommandStatus.SUCCEEDED
    assert done.result == {"container_id": "abc"}
    assert done.finished_at
    assert services.command_pending_for_node(node=node) == []
    assert services.command_record_result(node=node, command_id=command.pk, data={}) is None
    with pytest.raises(IllegalTransition, match="succeeded command cannot become running"):
        services.command_record_ack(node=node, command_id=command.pk)
    with pytest.raises(IllegalTransition):
        services.command_record_error(node=node, command_id=command.pk, code="internal", message="late")
    kinds = list(NodeEvent.objects.filter(command=command).order_by("created_at").values_list("kind", flat=True))
    assert kinds == ["command.queued", "command.dispatched", "command.running", "command.progress", "command.succeeded"]


def test_error_marks_failed(node, cluster, owner):
    command = _dispatched(node, cluster, owner)
    failed = services.command_record_error(
        node=node, command_id=command.pk, code="not_found", message="no such container", data={"container": "web"}
    )
    assert (failed.status, failed.error_code, failed.error_message) == (
        CommandStatus.FAILED,
        "not_found",
        "no such container",
    )


def test_frames_about_other_nodes_commands_are_ignored(cluster, register_node, owner):
    mine = register_node(cluster, "mine")
    other = register_node(cluster, "other")
    command = _dispatched(mine, cluster, owner)
    assert services.command_record_ack(node=other, command_id=command.pk) is None
    assert services.command_record_result(node=other, command_id=command.pk, data={}) is None
    assert services.command_record_error(node=other, command_id=command.pk, code="internal", message="x") is None
    assert services.command_record_progress(node=other, command_id=command.pk, message="x") is None
    command.refresh_from_db()
    assert command.status == CommandStatus.DISPATCHED
    assert not NodeEvent.objects.filter(node=other, command=command).exists()


def test_reconnect_delivery_marks_dispatched(cluster, register_node, owner):
    node = register_node(cluster, online=False)
    (command,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="endpoint.stop", payload={"endpoint_id": "e1"}, node=node
    )
    delivered = services.command_record_delivered(node=node, command_id=command.pk)
    assert delivered.status == CommandStatus.DISPATCHED
    assert delivered.attempts == 1
    assert services.command_record_delivered(node=node, command_id=command.pk) is None
    assert services.command_record_ack(node=node, command_id=command.pk, duplicate=True).status == CommandStatus.RUNNING


def test_command_frame_carries_secrets_and_key(node, cluster, owner):
    from agent import protocol

    (command,) = services.command_dispatch(
        actor=owner,
        cluster=cluster,
        command_type="container.create",
        payload={**CREATE, "registry_password": "pw"},
        node=node,
    )
    frame = groups.command_frame(Command.objects.get(pk=command.pk))
    decoded = protocol.decode(protocol.encode(frame))
    assert decoded.command_id == str(command.pk)
    assert decoded.idempotency_key == command.idempotency_key
    assert decoded.payload["registry_password"] == "pw"
    parsed = protocol.parse_payload(decoded.command_type, decoded.payload)
    assert parsed.image == "nginx:1.27"


def test_a_result_is_parsed_once_typed_and_tolerates_other_agent_versions(node, cluster, owner):
    """A newer agent's extra fields and an older one's missing or odd ones never fail the command: the raw
    result is stored as it came, and receivers read the typed result."""
    command = _dispatched(node, cluster, owner)
    services.command_record_ack(node=node, command_id=command.pk)
    seen = []

    def receiver(sender, command, **kwargs):
        seen.append(command.parsed_result)

    signals.command_finished.connect(receiver, weak=False, dispatch_uid="test-typed-result")
    try:
        data = {"container_id": "abc", "status": 7, "from_protocol_9": {"x": 1}}
        done = services.command_record_result(node=node, command_id=command.pk, data=data)
    finally:
        signals.command_finished.disconnect(dispatch_uid="test-typed-result")
    assert done.status == CommandStatus.SUCCEEDED
    assert done.result == data
    assert seen == [protocol.ContainerResult(container_id="abc")]
    assert Command.objects.get(pk=command.pk).parsed_result == protocol.ContainerResult(container_id="abc")
    failed = _dispatched(node, cluster, owner)
    services.command_record_error(node=node, command_id=failed.pk, code="internal", message="x", data={"a": 1})
    assert Command.objects.get(pk=failed.pk).parsed_result is None

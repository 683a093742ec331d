"""A dispatched command travels through a real Celery worker and the real Redis channel layer."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection

from fleet import groups, services
from fleet.models import Command, CommandStatus
from tests.fleet.conftest import facts_dict, make_csr_pem, make_key
from tests.support.processes import celery_worker, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def worker(tmp_path):
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    proc = celery_worker(tmp_path, queues="default,dispatch", env={"DATABASE_URL": url}, name="fleet-dispatch")
    yield proc
    proc.stop()


def test_command_is_claimed_by_the_worker_and_reaches_the_node_group(worker, owner, workspace):
    from agent import protocol

    cluster = services.cluster_create(actor=owner, workspace=workspace, name="live")
    _, raw = services.join_token_create(cluster=cluster, actor=owner)
    node, _ = services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts_dict())
    services.node_connected(node=node, facts=protocol.HostFacts(hostname="gpu-box-1"), inventory=protocol.Inventory())
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(groups.node_group(node.pk), channel)

    (command,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="container.stop", payload={"container": "web"}, node=node
    )

    async def receive() -> dict:
        return await asyncio.wait_for(layer.receive(channel), timeout=60)

    message = async_to_sync(receive)()
    assert message == {"type": "node.command", "command_id": str(command.pk)}, worker.log()
    wait_until(
        lambda: Command.objects.get(pk=command.pk).status == CommandStatus.DISPATCHED, timeout=30, what="dispatched"
    )
    assert Command.objects.get(pk=command.pk).attempts == 1
    assert "fleet.tasks.dispatch_command" in worker.log()

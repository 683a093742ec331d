"""Waking is idempotent under concurrency: many callers at once, each in its own thread and database
connection on real PostgreSQL (as requests in several web processes would), queue exactly one start."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from agent import protocol
from fleet.models import Command, CommandType
from fleet.workloads import services as workloads
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.tasks import endpoints_heal_tick, endpoints_idle_tick
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db(transaction=True)

LLAMA = protocol.CachedModel(model_id="meta-llama/Llama-3.2-1B", revision="main", path="/cache/llama", size_bytes=5)
CALLERS = 12


def test_concurrent_wakes_start_exactly_one_replica(owner, cluster, node, settings):
    agent_side.inventory(node, models=[LLAMA])
    endpoint = workloads.endpoint_create(
        actor=owner, cluster=cluster, model_id=LLAMA.model_id, min_replicas=0, idle_timeout_s=60
    )
    agent_side.result(endpoint.replicas.get().start_command, port=8001)
    then = timezone.now() - timedelta(seconds=120)
    Endpoint.objects.filter(pk=endpoint.pk).update(last_request_at=then)
    EndpointReplica.objects.filter(endpoint=endpoint).update(updated_at=then)
    assert endpoints_idle_tick() == [str(endpoint.pk)]
    settings.ENDPOINT_DRAIN_S = 0
    endpoints_heal_tick()
    agent_side.result(endpoint.replicas.get().stop_command)
    starts_before = Command.objects.filter(command_type=CommandType.ENDPOINT_START).count()
    go = threading.Event()
    woke: list[bool] = []
    lock = threading.Lock()

    def wake() -> None:
        go.wait(10)
        try:
            replica = workloads.endpoint_wake(endpoint_id=endpoint.pk)
        finally:
            connection.close()  # each thread's own connection
        with lock:
            woke.append(replica is not None)

    with ThreadPoolExecutor(max_workers=CALLERS) as pool:
        futures = [pool.submit(wake) for _ in range(CALLERS)]
        go.set()
        for future in futures:
            future.result()
    assert woke.count(True) == 1
    assert Command.objects.filter(command_type=CommandType.ENDPOINT_START).count() == starts_before + 1
    assert endpoint.events.filter(kind="endpoint.cold_start").count() == 1
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.PENDING
    assert EndpointReplica.objects.filter(endpoint=endpoint, status=EndpointStatus.PENDING).count() == 1

"""The race: concurrent admissions on real PostgreSQL, each in its own thread and database connection,
against a limit of N admit exactly N (the quota row's lock makes them take turns)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from fleet import services
from fleet.models import Command
from fleet.workloads.models import Container, ContainerStatus
from kernel.exceptions import QuotaExceeded
from tenancy import services as tenancy_services

pytestmark = pytest.mark.django_db(transaction=True)

REQUESTS = 100
THREADS = 25  # concurrent connections (the shared PostgreSQL allows 100 in all)
LIMIT = 7
NODES = 10  # spread over nodes: the lock each create takes on its node does not serialize them


def test_concurrent_creates_admit_exactly_the_limit(owner, workspace, cluster, register_node):
    nodes = [register_node(cluster, f"n{i}") for i in range(NODES)]
    tenancy_services.workspace_quota_set(actor=owner, workspace=workspace, limits={"containers": LIMIT})
    go = threading.Event()
    outcomes: list[str] = []
    lock = threading.Lock()

    def create(i: int) -> None:
        go.wait(10)
        try:
            services.command_dispatch(
                actor=owner,
                cluster=cluster,
                command_type="container.create",
                payload={"image": "nginx:1.27", "name": f"web-{i}"},
                node=nodes[i % NODES],
            )
            outcome = "admitted"
        except QuotaExceeded:
            outcome = "refused"
        finally:
            connection.close()  # each thread's own connection
        with lock:
            outcomes.append(outcome)

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        futures = [pool.submit(create, i) for i in range(REQUESTS)]
        go.set()
        for future in futures:
            future.result()
    assert outcomes.count("admitted") == LIMIT
    assert outcomes.count("refused") == REQUESTS - LIMIT
    assert Container.objects.filter(status=ContainerStatus.PENDING).count() == LIMIT
    assert Command.objects.filter(command_type="container.create").count() == LIMIT


def test_a_drain_pass_never_waits_for_the_quota_row(owner, workspace, cluster, register_node):
    """An admission holding the quota row may wait for a node the drain's caller holds: the pass does not
    wait for the row (busy, the next pass does the work) and so never closes a circle of locks."""
    from django.db import transaction

    from fleet.workloads import drain
    from tenancy.quotas import locked_quota
    from tests.fleet import agent_side

    a, _b = register_node(cluster, "a"), register_node(cluster, "b")
    (command,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="container.create", payload={"image": "x", "name": "w"}, node=a
    )
    agent_side.result(command, container_id="cid-w")
    services.node_drain(node=a, actor=owner)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                locked_quota(workspace.pk)
                held.set()
                release.wait(10)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        assert drain.drain_step(node_id=a.pk).status == "busy"
    finally:
        release.set()
        holder.join(10)
    assert [r["name"] for r in drain.drain_step(node_id=a.pk).replacing] == ["w"]

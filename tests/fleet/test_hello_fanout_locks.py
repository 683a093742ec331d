"""A hello and a fan-out never deadlock: a hello locks its node's row only, not its cluster's.

A fan-out inserts one command per node of the cluster, in node order; each insert takes a key-share lock
on the cluster and on its node. A hello (`agent_updates.node_auto_update`) locked its node *and* its
cluster (`select_related("cluster")` under `select_for_update()`): holding a node the fan-out had not
reached yet, it waited for the cluster the fan-out held, and the fan-out, arriving at that node, waited
for it — a deadlock that killed the fresh tunnel or made the POST answer 500 (23 at 500 agents in the
field). Real PostgreSQL; each side in its own thread and connection.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections

from fleet import agent_packages, agent_updates, services
from fleet.models import Command, ComputeCluster, Node

pytestmark = pytest.mark.django_db(transaction=True)


def _lock_waiters() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


def _run(target, errors: list[BaseException]) -> threading.Thread:  # type: ignore[no-untyped-def]
    def body() -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=body)
    thread.start()
    return thread


def test_a_hello_during_a_fan_out_waits_or_passes_but_never_deadlocks(owner, cluster, register_node):
    ComputeCluster.objects.filter(pk=cluster.pk).update(auto_update_agents=True)
    nodes = sorted((register_node(cluster, f"n{i}") for i in range(3)), key=lambda n: n.pk)
    Node.objects.filter(cluster=cluster).update(agent_version=agent_packages.served_version())  # no update due
    middle, last = nodes[1], nodes[2]
    errors: list[BaseException] = []
    # Hold the middle node, so that the fan-out stops there holding the cluster's key share (and the first
    # node's), before it reaches the last node.
    holder = connections.create_connection("default")
    holder.set_autocommit(False)
    with holder.cursor() as cursor:
        cursor.execute("SELECT id FROM fleet_node WHERE id = %s FOR UPDATE", [middle.pk])
    try:
        fan_out = _run(
            lambda: services.command_dispatch(
                actor=owner, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}
            ),
            errors,
        )
        deadline = time.monotonic() + 20
        while _lock_waiters() < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        hello = _run(lambda: agent_updates.node_auto_update(node=Node.objects.get(pk=last.pk)), errors)
        while hello.is_alive() and _lock_waiters() < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # the hello done, or waiting too
    finally:
        holder.rollback()  # the fan-out goes on, and reaches the last node
        holder.close()
    fan_out.join(60)
    hello.join(60)
    assert not errors, errors
    assert Command.objects.filter(cluster=cluster, command_type="model.download").count() == 3


def test_many_hellos_during_fan_outs_never_deadlock(owner, cluster, register_node):
    ComputeCluster.objects.filter(pk=cluster.pk).update(auto_update_agents=True)
    nodes = [register_node(cluster, f"n{i}") for i in range(8)]
    Node.objects.filter(cluster=cluster).update(agent_version=agent_packages.served_version())
    errors: list[BaseException] = []

    def fan_outs() -> None:
        for _ in range(5):
            services.command_dispatch(
                actor=owner, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}
            )

    def hellos(mine: list[Node]) -> None:
        for _ in range(10):
            for node in mine:
                agent_updates.node_auto_update(node=node)

    threads = [
        _run(fan_outs, errors),
        _run(lambda: hellos(nodes[::2]), errors),
        _run(lambda: hellos(nodes[1::2]), errors),
    ]
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert Command.objects.filter(cluster=cluster, command_type="model.download").count() == 5 * 8

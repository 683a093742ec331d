"""One lock order on every path that locks endpoints, nodes and commands (docs/architecture.md, "Lock order").

The tunnel's batch of agents' reports (`command_record_reports`) locked its commands and, through the events
it inserts, their nodes, then the endpoint its ack hook follows up; `endpoint_stop` locks the endpoint and
then the node it queues the stop for. A quick create-then-stop of an endpoint while its start's ack arrived
closed that circle: PostgreSQL killed one of them as a deadlock. Real PostgreSQL, each side in its own
thread and connection.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from django.db import connection, transaction

from agent import protocol
from fleet import services
from fleet.models import Command, CommandStatus
from fleet.workloads import services as workloads
from fleet.workloads.models import Endpoint, EndpointStatus
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db(transaction=True)

LLAMA = protocol.CachedModel(model_id="meta-llama/Llama-3.2-1B", revision="main", path="/cache/llama", size_bytes=5)


def _waits_for_a_lock(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return row is not None and row[0] == "Lock"


def _ack(command: Command) -> None:
    report = services.CommandReport.ack(command.node_id, str(command.pk))
    outcome = services.command_record_reports(reports=[report])[0]
    if isinstance(outcome, Exception):
        raise outcome


def test_an_ack_arriving_while_its_endpoint_is_being_stopped_waits_its_turn(cluster, register_node, owner, caplog):
    """The stop holds the endpoint when the ack's batch starts: the batch waits for the endpoint before it
    takes any node or command, so the stop gets the node and finishes, and then the ack is recorded."""
    node = register_node(cluster, "a")
    agent_side.inventory(node, models=[LLAMA])
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id)
    start = endpoint.start_command
    held, stop_now = threading.Event(), threading.Event()
    acker_pid: list[int] = []
    errors: list[BaseException] = []

    def stopper() -> None:
        try:
            with transaction.atomic():
                Endpoint.objects.select_for_update().get(pk=endpoint.pk)  # endpoint_stop's first lock
                held.set()
                assert stop_now.wait(20)
                workloads.endpoint_stop(actor=owner, endpoint=endpoint)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    def acker() -> None:
        try:
            assert held.wait(20)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                acker_pid.append(cursor.fetchone()[0])
            _ack(start)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    caplog.set_level(logging.ERROR)
    threads = [threading.Thread(target=stopper), threading.Thread(target=acker)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 20
    while not (acker_pid and _waits_for_a_lock(acker_pid[0])) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop_now.set()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
    assert Command.objects.get(pk=start.pk).status == CommandStatus.RUNNING
    assert Endpoint.objects.get(pk=endpoint.pk).status == EndpointStatus.STOPPING


def test_quick_create_then_stop_of_several_endpoints_while_acks_arrive(cluster, register_node, owner, caplog):
    nodes = [register_node(cluster, f"n{i}") for i in range(2)]
    for node in nodes:
        agent_side.inventory(node, models=[LLAMA])
    done = threading.Event()
    errors: list[BaseException] = []
    caplog.set_level(logging.ERROR)

    def operator() -> None:
        try:
            for i in range(6):
                endpoint = workloads.endpoint_create(
                    actor=owner, cluster=cluster, model_id=LLAMA.model_id, node=nodes[i % 2]
                )
                workloads.endpoint_stop(actor=owner, endpoint=endpoint)
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()
            connection.close()

    def agents() -> None:
        """Both nodes acknowledge every endpoint command as it appears, as their tunnels do."""
        try:
            while True:
                finished = done.is_set()
                queued = list(Command.objects.filter(command_type__startswith="endpoint.", status="queued"))
                reports = [services.CommandReport.ack(c.node_id, str(c.pk)) for c in queued]
                if reports:
                    for outcome in services.command_record_reports(reports=reports):
                        if isinstance(outcome, Exception):
                            raise outcome
                elif finished:
                    return
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=operator), threading.Thread(target=agents)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]
    assert Endpoint.objects.count() == 6
    assert set(Endpoint.objects.values_list("status", flat=True)) == {EndpointStatus.STOPPING}
    assert not Command.objects.filter(status="queued").exists()

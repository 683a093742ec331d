"""Stopping or deleting a Ray cluster takes its hosts before the cluster (the fleet's one lock order).

Recording a command's outcome locks the node it ran on and then (through raymgr's result hooks) the Ray
cluster's rows; `ray_cluster_delete` moved the cluster to `deleting` first and then locked each host to queue
its `ray.node.stop`. An outcome arriving on one host while the cluster was being deleted closed the circle:
PostgreSQL killed one side as a deadlock (seen in the Ray-in-containers end-to-end test). Real PostgreSQL, each
side in its own thread and connection.
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from fleet.models import Node
from raymgr import services
from raymgr.models import RayCluster, RayClusterStatus
from tests.raymgr.conftest import start_head

pytestmark = pytest.mark.django_db(transaction=True)


def _waits_for_a_lock(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return row is not None and row[0] == "Lock"


def test_a_delete_waits_for_an_outcome_holding_a_host_instead_of_deadlocking(compute, add_node, make_ray, owner):
    host = add_node(compute, "cpu-1")
    cluster = make_ray()
    start_head(cluster)
    held, go_on = threading.Event(), threading.Event()
    deleter_pid: list[int] = []
    errors: list[BaseException] = []

    def recorder() -> None:  # an outcome on the host: the node first, then the Ray cluster's row
        try:
            with transaction.atomic():
                Node.objects.select_for_update().get(pk=host.pk)
                held.set()
                assert go_on.wait(20)
                RayCluster.objects.select_for_update().get(pk=cluster.pk)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    def deleter() -> None:
        try:
            assert held.wait(20)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                deleter_pid.append(cursor.fetchone()[0])
            services.ray_cluster_delete(actor=owner, cluster=RayCluster.objects.get(pk=cluster.pk))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=recorder), threading.Thread(target=deleter)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 20
    while not (deleter_pid and _waits_for_a_lock(deleter_pid[0])) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert deleter_pid
    assert _waits_for_a_lock(deleter_pid[0]), "the delete never waited for the host"
    go_on.set()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert RayCluster.objects.get(pk=cluster.pk).status == RayClusterStatus.DELETING

"""The Celery worker survives Redis restarts under dispatch load, and commands flow again after each.

Found in a soak with faults: on the second Redis restart the worker exited with
`Unrecoverable error: AttributeError("'NoneType' object has no attribute 'hostname'")`, and no command
was dispatched until someone restarted it (the kombu bug and its fix: `cleverthis.kombu_fixes`).

The real thing: a private redis-server (the broker and channel layer of this control plane only), a
daphne replica, a Celery worker started as the Procfile starts it (prefork, two processes, gossip,
mingle and event heartbeats on), and a real agent. Two threads keep posting commands through the API;
Redis is killed and started again (empty) twice, each time while one dispatch task is held mid-flight
(the crash needs an unacknowledged task while the worker polls for more). After each restart the worker
must not have crashed, must consume dispatch tasks again and report a fresh heartbeat (/healthz), and a
command posted after the restart must reach the agent and succeed. The times it took are printed (`-s`).
Without the fix the worker crashed in each of three runs (at the first or the second restart).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid

import pytest
import requests
from celery import Celery
from django.db import connection, connections
from django.utils import timezone
from rest_framework.authtoken.models import Token

from fleet.models import Command, Node
from tests.e2e.conftest import node_of
from tests.support.live import ControlPlane, subprocess_env
from tests.support.private_redis import PrivateRedis
from tests.support.processes import VENV_BIN, ManagedProcess, wait_until

RESTARTS = 2
# How long Redis stays down each time: a quick restart, then an outage long enough that Celery's own
# reconnect waits (2, 4, 6 ... s) would already leave it sleeping past the moment Redis is back.
DOWN_S = (1, 12)
# Generous: the goal is 15 s; the bound only catches "never".
RECOVERY_BOUND_S = 90


def procfile_worker(plane: ControlPlane) -> ManagedProcess:
    """The worker as the Procfile runs it (not the suite's solo worker): the crash was in this one."""
    argv = [
        str(VENV_BIN / "celery"),
        *("-A", "cleverthis", "worker", "-Q", "default,dispatch", "--loglevel=INFO"),
        *("--concurrency=2", "-n", "broker-loss@%h"),
    ]
    return ManagedProcess("celery-worker", argv, log_dir=plane.log_dir, env=plane.env)


class CommandLoad:
    """Threads posting model.download commands through the API as fast as it answers; failures
    (Redis gone) are counted and ignored."""

    def __init__(self, base_url: str, token: str, cluster_id: int, threads: int = 2) -> None:
        self.base_url = base_url
        self.token = token
        self.cluster_id = cluster_id
        self.stopping = threading.Event()
        self.posted = 0
        self.failed = 0
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> CommandLoad:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(30)

    def _run(self) -> None:
        session = requests.Session()
        while not self.stopping.is_set():
            try:
                response = session.post(
                    f"{self.base_url}/api/v1/clusters/{self.cluster_id}/commands/",
                    json={"command_type": "model.download", "payload": {"model_id": "acme/tiny"}},
                    headers={"Authorization": f"Token {self.token}"},
                    timeout=10,
                )
                ok = response.status_code in (200, 201, 202)
            except requests.RequestException:
                ok = False
            if ok:
                self.posted += 1
            else:
                self.failed += 1
            time.sleep(0.5)


def dispatch_health(plane: ControlPlane) -> dict | None:
    with contextlib.suppress(requests.RequestException, ValueError):
        return requests.get(f"{plane.url}/healthz", timeout=5).json()["dispatch"]
    return None


def first_after(since, field: str, **status):
    """The earliest `field` time of the commands posted after `since` (None while there is none)."""
    rows = Command.objects.filter(created_at__gte=since, **{f"{field}__isnull": False}, **status)
    return rows.order_by(field).values_list(field, flat=True).first()


class HeldDispatch:
    """A real dispatch task held mid-flight: its command's row is locked, so the worker's claim waits.

    With it the worker has an unacknowledged task (acks_late) while it polls the queues for more when
    Redis goes: the state the crash needs. The task goes straight onto the control plane's broker (this
    test process's own Celery app publishes elsewhere); `release()` lets the claim go on.
    """

    def __init__(self, broker_url: str, node: Node) -> None:
        self.command = Command.objects.create(
            node=node,
            cluster=node.cluster,
            command_type="model.download",
            payload={"model_id": "acme/tiny"},
            idempotency_key=uuid.uuid4().hex,
        )
        self.locker = connections.create_connection("default")
        self.locker.set_autocommit(False)
        with self.locker.cursor() as cursor:
            cursor.execute("SELECT id FROM fleet_command WHERE id = %s FOR UPDATE", [self.command.pk])
        app = Celery("held", broker=broker_url, set_as_current=False)  # the suite's own app stays current
        try:
            app.send_task("fleet.tasks.dispatch_command", args=[str(self.command.pk)], queue="dispatch")
        finally:
            app.close()
        wait_until(self._claim_waits, timeout=30, what="the worker's claim waits on the row lock")

    def _claim_waits(self) -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE 'UPDATE \"fleet_command\"%%'"
            )
            return bool(cursor.fetchall())

    def release(self) -> None:
        self.locker.rollback()
        self.locker.close()


def restart_redis_and_measure(
    plane: ControlPlane, redis: PrivateRedis, worker: ManagedProcess, node: Node, restart: int
) -> str:
    """Kill Redis with dispatch tasks in flight, start it again empty, wait until commands flow; what it took."""
    consumed_before = worker.log().count("Task fleet.tasks.dispatch_command[")
    held = HeldDispatch(redis.url, node)
    try:
        redis.kill()
        down = dispatch_health(plane)
        assert down is not None
        assert down["broker_reachable"] is False, down
        time.sleep(DOWN_S[restart - 1])
        redis.start()  # empty: queues, heartbeats, channel groups are gone
        up_at = timezone.now()
        up = time.monotonic()
    finally:
        held.release()

    wait_until(
        lambda: first_after(up_at, "finished_at", status="succeeded") is not None or not worker.alive(),
        timeout=RECOVERY_BOUND_S,
        what=f"a command posted after restart {restart} to succeed",
    )
    # (a worker that hit the crash logs it at once, then waits for its running tasks before it exits)
    assert "Unrecoverable error" not in worker.log(), worker.log()[-6000:]
    assert worker.alive(), worker.log()[-6000:]
    seen_s = time.monotonic() - up
    wait_until(
        lambda: worker.log().count("Task fleet.tasks.dispatch_command[") > consumed_before,
        timeout=RECOVERY_BOUND_S,
        what=f"the worker consuming dispatch tasks after restart {restart}",
    )
    wait_until(
        lambda: (dispatch_health(plane) or {}).get("ok") is True,
        timeout=RECOVERY_BOUND_S,
        what=f"a fresh worker heartbeat after restart {restart}",
    )
    dispatched = first_after(up_at, "dispatched_at")
    finished = first_after(up_at, "finished_at", status="succeeded")
    return (
        f"restart {restart}: the first command posted after Redis was back was dispatched after "
        f"{(dispatched - up_at).total_seconds():.1f} s and succeeded after {(finished - up_at).total_seconds():.1f} s "
        f"(seen {seen_s:.1f} s)"
    )


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_worker_survives_redis_restarts_under_dispatch_load(tmp_path, cluster, operator, agents):
    user, _ = operator
    redis = PrivateRedis(tmp_path)
    redis.start()
    env = subprocess_env(TEST_REDIS_URL=redis.url, NODE_OFFLINE_AFTER_S="60", WORKER_HEARTBEAT_INTERVAL_S="1")
    plane = ControlPlane(log_dir=tmp_path, env=env)
    measured: list[str] = []
    try:
        plane.start_replica()
        plane.worker = worker = procfile_worker(plane)
        token = Token.objects.create(user=user).key
        _, state, _ = agents(plane, cluster, user, "a")
        node = node_of(state)
        wait_until(lambda: Node.objects.get(pk=node.pk).connected, timeout=60, what="agent online")
        wait_until(lambda: (dispatch_health(plane) or {}).get("ok") is True, timeout=60, what="worker heartbeat")

        with CommandLoad(plane.url, token, cluster.pk) as load:
            wait_until(lambda: Command.objects.filter(status="succeeded").count() >= 5, timeout=90, what="load")
            for restart in range(1, RESTARTS + 1):
                measured.append(restart_redis_and_measure(plane, redis, worker, node, restart))
                time.sleep(3)  # load runs on between the restarts
        assert worker.alive()
        log = worker.log()
        assert "Unrecoverable error" not in log, log[-6000:]
        assert log.count("Connected to redis://") >= RESTARTS + 1
        assert load.posted > 0
        print("\n".join([*measured, f"commands posted: {load.posted}, refused while Redis was down: {load.failed}"]))
    finally:
        plane.stop()
        redis.stop()

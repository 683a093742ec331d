"""Faults: a web replica killed, Redis restarted, the Celery worker killed mid-dispatch, a partition.

The process tests (marked `integration`) run the real thing: web replicas, a Celery worker, real
agents (`python -m agent run`), PostgreSQL and Redis. The partition-safety tests at the end are
plain database tests of the beat pass (`nodes_mark_lost_offline`) and the passes it pauses.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import signal
import threading
import time
from pathlib import Path

import pytest
import requests
from django.db import connection
from django.utils import timezone
from rest_framework.authtoken.models import Token

from agent import protocol as p
from agent.config import AgentConfig
from agent.transport.tunnel import ReconnectPolicy, TunnelClient
from fleet import services
from fleet.models import ClusterEvent, Command, ComputeCluster, Node, NodeEvent
from fleet.tasks import mark_lost_nodes_offline
from fleet.workloads.tasks import drain_tick
from tests.e2e.conftest import node_of
from tests.support.live import ControlPlane, agent_join, subprocess_env
from tests.support.private_redis import PrivateRedis
from tests.support.processes import free_port, wait_until

# --------------------------------------------------------------------------------------------------
# a tiny TCP load balancer (asyncio, loopback only)


class LoadBalancer:
    """Forwards each TCP connection on 127.0.0.1:`port` to the first backend that accepts it.

    Backends are tried in order, so every connection lands on backend 0 while it is up and fails over
    to the next one when it is gone: the agents see one URL, like behind a real load balancer.
    `routed` counts connections per backend port.
    """

    def __init__(self, backends: list[int]) -> None:
        self.backends = backends
        self.port = free_port()
        self.routed: dict[int, int] = {b: 0 for b in backends}
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> LoadBalancer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for backend in self.backends:
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", backend)
            except OSError:
                continue
            self.routed[backend] += 1
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
            return
        writer.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def stop(self) -> None:
        async def shutdown() -> None:
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
        self._thread.join(5)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _all_succeeded(ids: list) -> bool:
    return Command.objects.filter(pk__in=ids, status="succeeded").count() == len(ids)


def _assert_each_ran_once(ids: list) -> None:
    for command in Command.objects.filter(pk__in=ids):
        kinds = list(NodeEvent.objects.filter(command=command).values_list("kind", flat=True))
        assert kinds.count("command.succeeded") == 1, (command.pk, kinds)


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_killing_the_replica_holding_the_tunnels_loses_no_command(tmp_path, cluster, operator, agents, hub, settings):
    """kill -9 the web replica holding every tunnel: agents reconnect through the balancer to the other one.

    Commands dispatched right after the kill (while the dead replica still looks connected in the
    database) are delivered after the reconnect, once each, and each runs once on its node.
    """
    user, _ = operator
    hub.add_repo("acme/second", {"config.json": b"{}", "weights.bin": b"2" * 2048})
    settings.NODE_OFFLINE_AFTER_S = 30
    plane = ControlPlane(log_dir=tmp_path, env=subprocess_env(NODE_OFFLINE_AFTER_S="30"))
    first, second = plane.start_replica(), plane.start_replica()
    plane.start_worker()
    balancer = LoadBalancer([first, second]).start()
    try:
        procs = [agents(plane, cluster, user, name, url=balancer.url)[0] for name in ("a", "b", "c")]
        wait_until(
            lambda: Node.objects.filter(cluster=cluster, status="online", connected=True).count() == 3,
            timeout=40,
            what="three nodes online",
        )
        before = services.command_dispatch(
            actor=user, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}
        )
        wait_until(lambda: _all_succeeded([c.pk for c in before]), timeout=60, what="first batch")
        assert balancer.routed[second] == 0  # every tunnel is on the first replica

        plane.replicas[0].kill()
        killed_at = time.monotonic()
        after = services.command_dispatch(
            actor=user, cluster=cluster, command_type="model.download", payload={"model_id": "acme/second"}
        )
        assert len(after) == 3
        # every agent is back, on the surviving replica, within 10 s of the kill
        wait_until(
            lambda: all(p.log().count("connected to") >= 2 for p in procs), timeout=10, what="all agents reconnect"
        )
        reconnect_s = time.monotonic() - killed_at
        assert balancer.routed[second] >= 3
        wait_until(lambda: _all_succeeded([c.pk for c in after]), timeout=60, what="second batch after failover")
        _assert_each_ran_once([c.pk for c in [*before, *after]])
        for proc in procs:
            assert proc.log().count("command model.download succeeded") == 2, proc.log()[-2000:]
        assert len(hub.gets_of("weights.bin")) == 6  # each node downloaded each model once
        print(f"reconnect after kill -9: {reconnect_s:.1f} s")
    finally:
        balancer.stop()
        plane.stop()


# --------------------------------------------------------------------------------------------------
# Redis restart


def _api_dispatch(base_url: str, token: str, cluster: ComputeCluster, model: str) -> list[str]:
    response = requests.post(
        f"{base_url}/api/v1/clusters/{cluster.pk}/commands/",
        json={"command_type": "model.download", "payload": {"model_id": model}},
        headers={"Authorization": f"Token {token}"},
        timeout=30,
    )
    assert response.status_code in (200, 201, 202), response.text
    body = response.json()
    rows = body if isinstance(body, list) else body.get("commands", body.get("results", []))
    return [row["id"] for row in rows]


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_dispatch_resumes_after_redis_restarts(tmp_path, cluster, operator, agents, hub):
    """Redis (broker + channel layer) dies and comes back empty: the agent's tunnel stays open through it,
    and a command sent afterwards arrives over that same tunnel, once.

    The control plane's processes all use a private Redis; commands go in through the API of the
    running web server, so this test process never needs Redis itself. No heartbeat renews the tunnel's
    groups during the test (TUNNEL_GROUP_REFRESH_S): the web process joins them again itself.
    """
    user, _ = operator
    hub.add_repo("acme/second", {"config.json": b"{}", "weights.bin": b"2" * 2048})
    redis = PrivateRedis(tmp_path)
    redis.start()
    env = subprocess_env(TEST_REDIS_URL=redis.url, NODE_OFFLINE_AFTER_S="30", TUNNEL_GROUP_REFRESH_S="3600")
    plane = ControlPlane(log_dir=tmp_path, env=env)
    try:
        plane.start_replica()
        plane.start_worker()
        token = Token.objects.create(user=user).key
        proc, state, _ = agents(plane, cluster, user, "a")
        node = node_of(state)
        wait_until(lambda: Node.objects.get(pk=node.pk).connected, timeout=30, what="online")
        ids = _api_dispatch(plane.url, token, cluster, "acme/tiny")
        wait_until(lambda: _all_succeeded(ids), timeout=60, what="command before the restart")

        redis.kill()
        time.sleep(1)
        redis.start()  # empty: queues, groups and results are gone
        deadline = time.monotonic() + 60
        later: list[str] = []
        while not later and time.monotonic() < deadline:
            with contextlib.suppress(AssertionError, requests.RequestException):
                later = _api_dispatch(plane.url, token, cluster, "acme/second")
            if not later:
                time.sleep(1)
        assert later, plane.logs()
        wait_until(lambda: _all_succeeded(later), timeout=60, what="command after the redis restart")
        _assert_each_ran_once([*ids, *later])
        assert proc.log().count("command model.download succeeded") == 2
        # how it recovered: the tunnel stayed open (one session, no disconnect of the node); the web
        # process noticed the empty Redis and joined the tunnel's groups again
        assert proc.log().count("connected to") == 1, proc.log()[-3000:]
        assert not NodeEvent.objects.filter(node=node, kind="disconnected").exists()
        replica_log = plane.replicas[0].log()
        assert "Redis lost its data" in replica_log or "receive failed" in replica_log, replica_log[-3000:]
        assert plane.worker is not None
        assert plane.worker.alive()
    finally:
        plane.stop()
        redis.stop()


# --------------------------------------------------------------------------------------------------
# Celery worker killed mid-dispatch


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_worker_killed_mid_dispatch_redelivers_the_command_once(tmp_path, cluster, operator, agents):
    """The worker dies while its dispatch task runs (acks_late): a new worker gets the task again.

    The task is held mid-flight deterministically: the test locks the command row, so the worker's
    claim (a conditional UPDATE) blocks; then the worker is killed with SIGKILL and its database
    session ended, as a crash would. The redelivered task claims and sends; the agent runs it once.
    """
    user, _ = operator
    env = subprocess_env(
        CELERY_VISIBILITY_TIMEOUT_S="3",
        CELERY_UNACKED_RESTORE_INTERVAL_S="1",
        CELERY_UNACKED_RESTORE_THROTTLE="1",
        NODE_OFFLINE_AFTER_S="30",
    )
    plane = ControlPlane(log_dir=tmp_path, env=env)
    try:
        plane.start_replica()
        plane.start_worker()
        proc, state, _ = agents(plane, cluster, user, "a")
        node = node_of(state)
        wait_until(lambda: Node.objects.get(pk=node.pk).connected, timeout=30, what="online")

        from django.db import connections

        locker = connections.create_connection("default")
        locker.set_autocommit(False)
        with locker.cursor() as cursor:
            (command,) = services.command_dispatch(
                actor=user,
                cluster=cluster,
                command_type="model.download",
                payload={"model_id": "acme/tiny"},
                node=node,
            )
            cursor.execute("SELECT id FROM fleet_command WHERE id = %s FOR UPDATE", [command.pk])

            def worker_blocked() -> bool:
                with connection.cursor() as c:
                    c.execute(
                        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock' AND query LIKE 'UPDATE \"fleet_command\"%%'"
                    )
                    return bool(c.fetchall())

            wait_until(worker_blocked, timeout=30, what="the worker's claim waits on the row lock")
            assert plane.worker is not None
            plane.worker.kill()
            plane.worker.popen.wait(10)
            with connection.cursor() as c:  # the crashed worker's session goes with it
                c.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND query LIKE 'UPDATE \"fleet_command\"%%'"
                )
        locker.rollback()
        locker.close()
        assert Command.objects.get(pk=command.pk).status == "queued"

        plane.worker = None
        plane.start_worker()
        wait_until(
            lambda: Command.objects.get(pk=command.pk).status == "succeeded", timeout=60, what="redelivered command"
        )
        assert proc.log().count("command received: model.download") == 1
        assert proc.log().count("command model.download succeeded") == 1
        assert Command.objects.get(pk=command.pk).attempts == 1
        assert plane.worker.log().count("fleet.tasks.dispatch_command") >= 1
    finally:
        plane.stop()


# --------------------------------------------------------------------------------------------------
# zombie tunnels: open sockets of nodes the control plane lost track of


def _dispatch(user, node: Node, model: str = "acme/tiny") -> Command:
    (command,) = services.command_dispatch(
        actor=user, cluster=node.cluster, command_type="model.download", payload={"model_id": model}, node=node
    )
    return command


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_node_lost_while_its_tunnel_is_held_gets_it_closed_and_every_command_queued_meanwhile(
    tmp_path, cluster, operator, agents, settings
):
    """The zombie: the agent keeps its socket open (pings answered) but sends no heartbeat, here because
    the control plane told it to beat every 10 minutes. The beat pass marks the node offline and closes
    that tunnel through the channel layer; the agent reconnects, says hello, and gets every command
    queued for it while it was marked offline. A tunnel that just said hello is spared."""
    user, _ = operator
    settings.NODE_OFFLINE_AFTER_S = 3
    plane = ControlPlane(
        log_dir=tmp_path, env=subprocess_env(AGENT_HEARTBEAT_INTERVAL_S="600", NODE_OFFLINE_AFTER_S="3")
    )
    try:
        plane.start_replica()
        plane.start_worker()
        proc, state, _ = agents(plane, cluster, user, "a")
        node = node_of(state)
        wait_until(lambda: Node.objects.get(pk=node.pk).connected, timeout=30, what="online")
        time.sleep(3)  # silent past NODE_OFFLINE_AFTER_S, tunnel still open
        wait_until(lambda: mark_lost_nodes_offline() == 1, timeout=10, interval=0.5, what="the beat marks it lost")
        marked_at = time.monotonic()
        assert proc.log().count("connected to") == 1
        node.refresh_from_db()
        assert (node.status, node.connected) == ("offline", False)
        queued = [_dispatch(user, node) for _ in range(3)]

        wait_until(lambda: proc.log().count("connected to") == 2, timeout=15, what="agent reconnects")
        reconnect_s = time.monotonic() - marked_at
        ids = [c.pk for c in queued]
        wait_until(lambda: _all_succeeded(ids), timeout=30, what="commands queued while offline delivered")
        delivered_s = time.monotonic() - marked_at
        node.refresh_from_db()
        assert (node.status, node.connected) == ("online", True)
        assert all(c.attempts == 1 for c in Command.objects.filter(pk__in=ids))
        _assert_each_ran_once(ids)
        assert "control plane closed the tunnel: 4408 stale tunnel" in proc.log()

        from fleet.groups import send_to_node, silent_message

        send_to_node(node.pk, silent_message(60))  # this tunnel said hello seconds ago: it stays
        time.sleep(2)
        assert proc.log().count("connected to") == 2
        print(f"zombie tunnel: reconnect {reconnect_s:.1f} s, queued commands succeeded {delivered_s:.1f} s")
    finally:
        plane.stop()


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_through_a_tunnel_held_disconnected_closes_it(control_plane, cluster, operator, agents):
    """Heartbeats flow but the node is recorded disconnected (the late close of an older socket of the
    same process clears the flag): commands would stay queued for good. The next heartbeat's write
    sees it, the consumer closes that tunnel, and the reconnect makes the node connected again."""
    user, _ = operator
    proc, state, _ = agents(control_plane, cluster, user, "a")
    node = node_of(state)
    wait_until(lambda: Node.objects.get(pk=node.pk).connected, timeout=30, what="online")
    services.node_disconnected(node=node)
    cleared_at = time.monotonic()
    command = _dispatch(user, Node.objects.get(pk=node.pk))
    wait_until(lambda: proc.log().count("connected to") == 2, timeout=10, what="agent reconnects")
    reconnect_s = time.monotonic() - cleared_at
    wait_until(lambda: Command.objects.get(pk=command.pk).status == "succeeded", timeout=30, what="delivered")
    assert Node.objects.get(pk=node.pk).connected
    print(f"heartbeat on a tunnel held disconnected: reconnect {reconnect_s:.1f} s")


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_a_frozen_agent_is_dropped_by_websocket_pings_and_gets_its_commands_when_it_thaws(
    tmp_path, cluster, operator, agents, settings
):
    """SIGSTOP: the agent's kernel keeps the TCP connection up, so nothing but an unanswered ping can tell.
    The web server pings an idle tunnel and drops it when no pong comes; the node is recorded disconnected, a
    command sent meanwhile waits queued, and after SIGCONT the agent reconnects and runs it.
    Short ping timings here (2 s idle, 3 s timeout); the Procfile's are 10 s and 20 s."""
    user, _ = operator
    settings.NODE_OFFLINE_AFTER_S = 30
    env = subprocess_env(NODE_OFFLINE_AFTER_S="30", TUNNEL_PING_INTERVAL_S="2", TUNNEL_PING_TIMEOUT_S="3")
    plane = ControlPlane(log_dir=tmp_path, env=env)
    proc = None
    try:
        plane.start_replica()
        plane.start_worker()
        proc, state, _ = agents(plane, cluster, user, "a")
        node = node_of(state)
        wait_until(lambda: Node.objects.get(pk=node.pk).connected, timeout=30, what="online")
        proc.kill(signal.SIGSTOP)
        stopped_at = time.monotonic()
        wait_until(lambda: not Node.objects.get(pk=node.pk).connected, timeout=20, what="frozen tunnel dropped")
        detected_s = time.monotonic() - stopped_at
        command = _dispatch(user, Node.objects.get(pk=node.pk))
        time.sleep(1)
        assert Command.objects.get(pk=command.pk).status == "queued"

        proc.kill(signal.SIGCONT)
        resumed_at = time.monotonic()
        wait_until(lambda: Command.objects.get(pk=command.pk).status == "succeeded", timeout=30, what="delivered")
        delivered_s = time.monotonic() - resumed_at
        assert proc.log().count("connected to") == 2
        assert Node.objects.get(pk=node.pk).connected
        print(f"frozen agent: dropped {detected_s:.1f} s after SIGSTOP; command done {delivered_s:.1f} s after SIGCONT")
    finally:
        if proc is not None:
            proc.kill(signal.SIGCONT)
        plane.stop()


# --------------------------------------------------------------------------------------------------
# partition safety (database tests of the beat pass)


def _nodes(cluster: ComputeCluster, n: int, status: str = "online") -> list[Node]:
    now = timezone.now()
    return [
        Node.objects.create(
            cluster=cluster,
            name=f"{cluster.name}-{i}",
            hostname=f"h{i}",
            status=status,
            connected=True,
            last_heartbeat_at=now,
        )
        for i in range(n)
    ]


def _silence(nodes: list[Node], seconds: float = 600) -> None:
    Node.objects.filter(pk__in=[n.pk for n in nodes]).update(
        last_heartbeat_at=timezone.now() - dt.timedelta(seconds=seconds)
    )


@pytest.fixture
def fleet_cluster(owner, workspace):
    return services.cluster_create(actor=owner, workspace=workspace, name="part")


@pytest.mark.django_db
def test_mass_loss_marks_offline_but_pauses_automation_with_a_cluster_event(fleet_cluster, owner, workspace):
    nodes = _nodes(fleet_cluster, 4)
    other = services.cluster_create(actor=owner, workspace=workspace, name="calm")
    calm = _nodes(other, 4)
    draining_here = Node.objects.create(
        cluster=fleet_cluster,
        name="draining",
        hostname="d",
        status="draining",
        connected=True,
        last_heartbeat_at=timezone.now(),
    )
    draining_there = Node.objects.create(
        cluster=other,
        name="draining2",
        hostname="d2",
        status="draining",
        connected=True,
        last_heartbeat_at=timezone.now(),
    )
    _silence(nodes[:4])
    _silence(calm[:1])

    assert services.nodes_mark_lost_offline() == 5
    # the lost nodes are all offline, in both clusters
    assert Node.objects.filter(pk__in=[n.pk for n in nodes], status="offline", connected=False).count() == 4
    assert Node.objects.get(pk=calm[0].pk).status == "offline"
    fleet_cluster.refresh_from_db()
    other.refresh_from_db()
    assert fleet_cluster.automation_paused()
    assert not other.automation_paused()
    (event,) = ClusterEvent.objects.filter(cluster=fleet_cluster, kind="partition.suspected")
    assert (event.data["lost"], event.data["total"]) == (4, 5)
    assert not ClusterEvent.objects.filter(cluster=other).exists()
    # drain passes leave the paused cluster alone, and carry on elsewhere
    out = drain_tick()
    assert str(draining_here.pk) not in out
    assert out[str(draining_there.pk)] == "cordoned"
    assert Node.objects.get(pk=draining_here.pk).status == "draining"


@pytest.mark.django_db
def test_pause_expires_and_can_be_lifted(fleet_cluster, owner, settings):
    nodes = _nodes(fleet_cluster, 3)
    draining = Node.objects.create(
        cluster=fleet_cluster,
        name="dr",
        hostname="dr",
        status="draining",
        connected=True,
        last_heartbeat_at=timezone.now(),
    )
    _silence(nodes)
    services.nodes_mark_lost_offline()
    fleet_cluster.refresh_from_db()
    assert fleet_cluster.automation_paused()
    assert str(draining.pk) not in drain_tick()
    later = timezone.now() + dt.timedelta(seconds=settings.FLEET_PARTITION_PAUSE_S + 1)
    assert not fleet_cluster.automation_paused(now=later)
    services.cluster_resume_automation(actor=owner, cluster=fleet_cluster)
    assert not ComputeCluster.objects.get(pk=fleet_cluster.pk).automation_paused()
    assert drain_tick()[str(draining.pk)] == "cordoned"
    assert ClusterEvent.objects.filter(cluster=fleet_cluster, kind="automation.resumed").exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("total", "lost", "threshold", "paused"),
    [
        (10, 5, 0.5, False),  # exactly the threshold: not more than it
        (10, 6, 0.5, True),
        (10, 3, 0.2, True),
        (2, 2, 0.5, False),  # below FLEET_PARTITION_MIN_NODES (3): a small cluster just goes offline
        (4, 4, 1.0, False),  # 1.0 disables the safety
    ],
)
def test_threshold_and_minimum(fleet_cluster, settings, total, lost, threshold, paused):
    settings.FLEET_PARTITION_THRESHOLD = threshold
    settings.FLEET_PARTITION_MIN_NODES = 3
    nodes = _nodes(fleet_cluster, total)
    _silence(nodes[:lost])
    assert services.nodes_mark_lost_offline() == lost
    assert ComputeCluster.objects.get(pk=fleet_cluster.pk).automation_paused() is paused
    assert ClusterEvent.objects.filter(cluster=fleet_cluster, kind="partition.suspected").exists() is paused


@pytest.mark.django_db
def test_losses_spread_over_passes_do_not_pause(fleet_cluster):
    """One node at a time over several passes is ordinary churn, not a partition."""
    nodes = _nodes(fleet_cluster, 6)
    for node in nodes[:4]:
        _silence([node])
        assert services.nodes_mark_lost_offline() == 1
    assert not ComputeCluster.objects.get(pk=fleet_cluster.pk).automation_paused()


@pytest.mark.django_db
def test_paused_compute_cluster_is_skipped_by_the_ray_autoscaler(fleet_cluster, owner, workspace):
    from raymgr import services as ray_services
    from raymgr.models import RayCluster

    nodes = _nodes(fleet_cluster, 3)
    ray = ray_services.ray_cluster_create(actor=owner, workspace=workspace, compute_cluster=fleet_cluster, name="r")
    RayCluster.objects.filter(pk=ray.pk).update(status="running")
    assert ray_services.autoscale_pass() == 1
    _silence(nodes)
    services.nodes_mark_lost_offline()
    assert ray_services.autoscale_pass() == 0
    assert RayCluster.objects.get(pk=ray.pk).status == "running"


@pytest.mark.django_db
def test_a_redelivered_dispatch_of_a_claimed_but_unacknowledged_command_sends_it_again(fleet_cluster, owner):
    """A worker that died after its claim committed but before the send: the redelivered task re-sends.

    The agent deduplicates by idempotency key, so a second send never runs the work twice.
    """
    (node,) = _nodes(fleet_cluster, 1)
    (command,) = services.command_dispatch(
        actor=owner, cluster=fleet_cluster, command_type="model.download", payload={"model_id": "a/b"}, node=node
    )
    Command.objects.filter(pk=command.pk).update(
        status="dispatched", attempts=1, dispatched_at=timezone.now() - dt.timedelta(seconds=120)
    )
    assert services.command_claim_and_send(command_id=command.pk) is True
    row = Command.objects.get(pk=command.pk)
    assert (row.status, row.attempts) == ("dispatched", 2)
    assert NodeEvent.objects.filter(command=command, kind="command.dispatched").count() == 1
    # a fresh claim (another task racing the first) is not re-sent, nor an acknowledged command
    assert services.command_claim_and_send(command_id=command.pk) is False
    Command.objects.filter(pk=command.pk).update(
        status="running", acked_at=timezone.now(), dispatched_at=timezone.now() - dt.timedelta(seconds=120)
    )
    assert services.command_claim_and_send(command_id=command.pk) is False


# --------------------------------------------------------------------------------------------------
# supervised agent tasks: a failure injected into each, against the real control plane


class FaultyRunner:
    """Commands succeed at once; the journal look-up, inventory and proxy ports raise when armed."""

    def __init__(self) -> None:
        self.armed: dict[str, int] = {"completed": 0, "inventory": 0, "proxy_ports": 0}
        self.ran: list[str] = []

    def _maybe_fail(self, what: str) -> None:
        if self.armed[what] > 0:
            self.armed[what] -= 1
            raise RuntimeError(f"injected {what} failure")

    def run(self, command, progress):  # type: ignore[no-untyped-def]
        self.ran.append(command.idempotency_key)
        return p.Result(command_id=command.command_id, data={"ok": True})

    def completed(self, key: str) -> None:
        self._maybe_fail("completed")
        return None

    def inventory(self, gpus: list[p.GpuInfo]) -> p.Inventory:
        self._maybe_fail("inventory")
        return p.Inventory(gpus=gpus)

    def proxy_ports(self) -> set[int]:
        self._maybe_fail("proxy_ports")
        return set()


class InProcessAgent:
    """The real `TunnelClient` of a joined node, run in a thread of this test with a `FaultyRunner`."""

    def __init__(self, state: Path) -> None:
        self.runner = FaultyRunner()
        self.client = TunnelClient(
            AgentConfig.load(state),
            lambda mode, settings: self.runner,
            policy=ReconnectPolicy(base_s=0.2, cap_s=1.0),
        )
        self.loop = asyncio.new_event_loop()
        self.exit: list[BaseException | int] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.stop_event = asyncio.Event()
        try:
            self.exit.append(self.loop.run_until_complete(self.client.run(self.stop_event)))
        except BaseException as exc:  # what a crash of the agent looks like
            self.exit.append(exc)

    def start(self) -> InProcessAgent:
        self._thread.start()
        wait_until(lambda: self.client.sessions >= 1, timeout=30, what="in-process agent connected")
        return self

    def call(self, fn) -> None:  # type: ignore[no-untyped-def]
        """Run `fn` on the agent's loop (injections touch the live session's objects there)."""
        self.loop.call_soon_threadsafe(fn)

    def beats(self) -> int:
        return len(self.client.heartbeat_rtts)

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.stop_event.set)
            self._thread.join(15)
        self.loop.close()


@pytest.fixture
def in_process_agent(tmp_path, cluster, operator):
    started: list[InProcessAgent] = []

    def start(plane: ControlPlane) -> tuple[InProcessAgent, Node]:
        user, _ = operator
        _, raw = services.join_token_create(cluster=cluster, actor=user)
        state = tmp_path / f"state-inproc-{len(started)}"
        joined = agent_join(plane.url, raw, state)
        assert joined.returncode == 0, joined.stderr
        agent = InProcessAgent(state)
        started.append(agent)
        agent.start()
        node = node_of(state)
        wait_until(lambda: Node.objects.get(pk=node.pk).connected, timeout=20, what="connected")
        return agent, node

    yield start
    for agent in started:
        agent.stop()


def _failures(caplog, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.exc_info and text in r.getMessage()]


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_supervised_agent_tasks_recover_from_injected_failures(control_plane, in_process_agent, caplog, operator):
    """A failure injected into each long-lived agent task: logged once with its traceback, then heartbeats
    go on (restarted task) or the agent reconnects (failed session) within a bound; never half alive."""
    user, _ = operator
    agent, node = in_process_agent(control_plane)
    caplog.set_level(logging.INFO)
    wait_until(lambda: agent.beats() >= 2, timeout=10, what="heartbeats")
    timings: dict[str, float] = {}

    # heartbeats: the inventory step raises (as the container race did): the task restarts
    agent.runner.armed["inventory"] = 1
    wait_until(lambda: agent.runner.armed["inventory"] == 0, timeout=10, interval=0.01, what="heartbeat failed")
    failed_at, seen = time.monotonic(), agent.beats()
    wait_until(lambda: agent.beats() > seen, timeout=10, interval=0.01, what="a heartbeat after the failure")
    timings["heartbeat task"] = time.monotonic() - failed_at
    wait_until(lambda: agent.beats() >= seen + 3, timeout=10, what="heartbeats go on")
    assert agent.client.sessions == 1
    assert len(_failures(caplog, "heartbeats failed")) == 1

    # the frame sender dies (an unsendable item): the session ends and the agent reconnects
    def break_the_sender() -> None:
        sender = agent.client._sender
        assert sender is not None
        sender._control.append(object())  # type: ignore[arg-type]
        sender._wakeup.set()

    agent.call(break_the_sender)
    failed_at = time.monotonic()
    wait_until(lambda: agent.client.sessions == 2, timeout=15, what="reconnect after the sender failed")
    timings["frame sender"] = time.monotonic() - failed_at
    seen = agent.beats()
    wait_until(lambda: agent.beats() >= seen + 2, timeout=10, what="heartbeats on the new session")
    assert len(_failures(caplog, "frame sender failed")) == 1

    # the reader hits an unexpected error handling a frame: the session ends, the agent reconnects and
    # the command it was handling is delivered again on the new session
    spawn = agent.client._spawn
    tripped: list[bool] = []

    def spawn_failing_once(coro) -> None:  # type: ignore[no-untyped-def]
        if not tripped:
            tripped.append(True)
            coro.close()
            raise RuntimeError("injected reader failure")
        spawn(coro)

    agent.client._spawn = spawn_failing_once  # type: ignore[method-assign]
    failed_at = time.monotonic()
    (first,) = services.command_dispatch(
        actor=user, cluster=node.cluster, command_type="model.download", payload={"model_id": "a/b"}, node=node
    )
    wait_until(lambda: agent.client.sessions == 3, timeout=15, what="reconnect after the reader failed")
    wait_until(lambda: Command.objects.get(pk=first.pk).status == "succeeded", timeout=15, what="redelivered")
    timings["reader"] = time.monotonic() - failed_at
    assert len(_failures(caplog, "tunnel session failed unexpectedly")) == 1

    # the inventory report after a command fails: the session ends; the hello re-sends the inventory
    agent.runner.armed["proxy_ports"] = 1
    failed_at = time.monotonic()
    (second,) = services.command_dispatch(
        actor=user, cluster=node.cluster, command_type="model.download", payload={"model_id": "a/c"}, node=node
    )
    wait_until(lambda: agent.client.sessions == 4, timeout=15, what="reconnect after the inventory report failed")
    timings["inventory report"] = time.monotonic() - failed_at
    assert Command.objects.get(pk=second.pk).status == "succeeded"
    assert len(_failures(caplog, "inventory report failed")) == 1

    # the agent's own handling of a command fails: the command fails with the reason, nothing hangs
    agent.runner.armed["completed"] = 1
    (third,) = services.command_dispatch(
        actor=user, cluster=node.cluster, command_type="model.download", payload={"model_id": "a/d"}, node=node
    )
    wait_until(lambda: Command.objects.get(pk=third.pk).status == "failed", timeout=15, what="command failed")
    third.refresh_from_db()
    assert third.error_code == "internal"
    assert "injected completed failure" in third.error_message

    assert not agent.exit  # the agent never died
    assert Node.objects.get(pk=node.pk).connected
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
    print("recovered after an injected failure of: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))

"""Agent ↔ control plane end to end, all real processes: the web server, a Celery worker, Redis, PostgreSQL, agents.

Heartbeats run every second here (AGENT_HEARTBEAT_INTERVAL_S=1) and nodes go offline after 3 s of
silence, so the whole lifecycle fits in seconds. The tests marked `both_servers` run on uvicorn
(production) and on daphne (development) each; the others on the default server.
"""

from __future__ import annotations

import time

import pytest

from fleet import services
from fleet.models import Command, Node, NodeEvent
from tests.e2e.conftest import both_servers, node_of, wait_status
from tests.support.live import ControlPlane, agent_run, subprocess_env
from tests.support.processes import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@both_servers
def test_join_heartbeat_offline_and_back_online(control_plane, cluster, operator, agents, client):
    user, _ = operator
    proc, state, env = agents(control_plane, cluster, user, "a")
    node = node_of(state)
    wait_status(node, "online")
    wait_until(lambda: "heartbeat sent" in proc.log(), timeout=10, what="heartbeat")
    log = proc.log()
    assert "connected to 127.0.0.1:" in log
    assert "no GPU detected" in log

    # heartbeats update utilization
    wait_until(lambda: Node.objects.get(pk=node.pk).memory_percent > 0, timeout=10, what="utilization")
    node.refresh_from_db()
    assert node.connected
    assert node.memory_total_mb > 0

    # the node shows up online in the Nodes tab
    client.force_login(user)
    page = client.get(f"/compute/clusters/{cluster.pk}/nodes/").content.decode()
    assert node.name in page
    assert "online" in page

    # kill the agent → offline after the heartbeat timeout (beat task, run here on its own)
    proc.kill()
    time.sleep(3.5)
    from fleet.tasks import mark_lost_nodes_offline

    wait_until(
        lambda: mark_lost_nodes_offline() >= 0 and Node.objects.get(pk=node.pk).status == "offline",
        timeout=15,
        what="offline",
    )
    assert NodeEvent.objects.filter(node=node, kind="offline").exists()

    # restart → online again without re-registering
    restarted = agent_run(state, control_plane.log_dir, name="agent-a-restarted", env=env)
    try:
        wait_status(node, "online")
        assert Node.objects.filter(cluster=cluster).count() == 1
    finally:
        restarted.stop()


def test_agent_reconnects_after_control_plane_restart(control_plane, cluster, operator, agents):
    user, _ = operator
    proc, state, _ = agents(control_plane, cluster, user, "a")
    node = node_of(state)
    wait_until(lambda: proc.log().count("connected to") == 1, timeout=20, what="first connect")
    port = control_plane.ports[0]
    replica = control_plane.replicas.pop(0)
    control_plane.ports.pop(0)
    replica.kill()
    wait_until(lambda: "disconnected" in proc.log() or "cannot connect" in proc.log(), timeout=10, what="drop")
    time.sleep(2)  # the control plane stays down a little while the agent retries
    restarted_at = time.monotonic()
    control_plane.start_replica(port)
    wait_until(lambda: proc.log().count("connected to") == 2, timeout=15, what="reconnect")
    assert time.monotonic() - restarted_at < 10
    assert Node.objects.get(pk=node.pk).connected


@both_servers
def test_command_to_all_nodes_reaches_every_agent_once(control_plane, cluster, operator, agents, hub):
    user, _ = operator
    procs = [agents(control_plane, cluster, user, name)[0] for name in ("a", "b")]
    wait_until(
        lambda: Node.objects.filter(cluster=cluster, status="online").count() == 2, timeout=30, what="two nodes online"
    )
    commands = services.command_dispatch(
        actor=user, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}
    )
    assert len(commands) == 2
    wait_until(
        lambda: Command.objects.filter(pk__in=[c.pk for c in commands], status="succeeded").count() == 2,
        timeout=60,
        what="both downloads succeeded",
    )
    for proc in procs:
        assert proc.log().count("command received: model.download") == 1
    for command in Command.objects.filter(pk__in=[c.pk for c in commands]):
        kinds = list(NodeEvent.objects.filter(command=command).values_list("kind", flat=True))
        assert kinds.count("command.succeeded") == 1
        assert "command.running" in kinds
        assert command.result["model_id"] == "acme/tiny"
    # the node's inventory now lists the cached model
    wait_until(
        lambda: all(
            any(m["model_id"] == "acme/tiny" for m in node.inventory.get("models", []))
            for node in Node.objects.filter(cluster=cluster)
        ),
        timeout=10,
        what="inventory reports the model",
    )
    # the Hub was asked once per node for the weights
    assert len(hub.gets_of("weights.bin")) == 2


def test_commands_queued_while_offline_are_delivered_on_reconnect(control_plane, cluster, operator, agents, tmp_path):
    user, _ = operator
    proc, state, env = agents(control_plane, cluster, user, "a")
    node = node_of(state)
    wait_status(node, "online")
    proc.stop()
    wait_until(lambda: not Node.objects.get(pk=node.pk).connected, timeout=10, what="disconnect recorded")
    (command,) = services.command_dispatch(
        actor=user,
        cluster=cluster,
        command_type="model.download",
        payload={"model_id": "acme/tiny"},
        node=Node.objects.get(pk=node.pk),
    )
    time.sleep(1)
    assert Command.objects.get(pk=command.pk).status == "queued"
    restarted = agent_run(state, tmp_path, name="agent-a-again", env=env)
    try:
        wait_until(lambda: Command.objects.get(pk=command.pk).status == "succeeded", timeout=60, what="delivered")
        # a second delivery of the same idempotency key does not run the work again
        Command.objects.filter(pk=command.pk).update(status="dispatched", acked_at=None)
        from fleet.groups import command_message, send_to_node

        send_to_node(node.pk, command_message(command.pk))
        wait_until(lambda: Command.objects.get(pk=command.pk).status == "succeeded", timeout=20, what="re-ack")
        assert restarted.log().count("command received: model.download") == 2
        assert restarted.log().count("command model.download succeeded") == 1
    finally:
        restarted.stop()


@both_servers
def test_delete_closes_the_socket_on_another_replica_and_refuses_reconnect(control_plane, cluster, operator, agents):
    user, _ = operator
    second_port = control_plane.start_replica()
    # the agent's tunnel lives on replica 2; the delete is handled by this process (another one)
    proc, state, _ = agents(control_plane, cluster, user, "a", url=f"http://127.0.0.1:{second_port}")
    node = node_of(state)
    wait_status(node, "online")
    started = time.monotonic()
    services.node_delete(node=node, actor=user)
    wait_until(lambda: not proc.alive(), timeout=60, what="agent exits after revocation")
    assert time.monotonic() - started < 60
    assert proc.popen.returncode == 3
    assert "node revoked" in proc.log()
    # the certificate is refused on every later connect
    again = agent_run(state, control_plane.log_dir, name="agent-a-revoked")
    wait_until(lambda: not again.alive(), timeout=30, what="revoked agent refused")
    assert again.popen.returncode == 3
    assert not Node.objects.filter(pk=node.pk).exists()


def test_backoff_broadcast_keeps_agents_away_then_they_return(control_plane, cluster, operator, agents):
    from django.core.management import call_command

    user, _ = operator
    proc, _state, _ = agents(control_plane, cluster, user, "a")
    wait_until(lambda: proc.log().count("connected to") == 1, timeout=20, what="connect")
    call_command("tunnel_backoff", seconds=3, reason="deploy")
    wait_until(lambda: "asked to back off 3.0s: deploy" in proc.log(), timeout=10, what="backoff received")
    asked_at = time.monotonic()
    wait_until(lambda: proc.log().count("connected to") == 2, timeout=20, what="reconnect after backoff")
    assert time.monotonic() - asked_at >= 2.9


@both_servers
def test_agent_logs_the_code_and_reason_the_control_plane_closed_with_and_retries(
    control_plane, cluster, operator, agents, tmp_path
):
    """Close reasons reach the agent: one whose hello is refused logs 4401 and why, and keeps retrying."""
    from agent import identity
    from agent.config import KEY_FILE

    user, _ = operator
    proc, state, env = agents(control_plane, cluster, user, "a")
    wait_status(node_of(state), "online")
    proc.stop()
    identity.write_private_key(identity.generate_key(), state / KEY_FILE)  # no longer the certificate's key
    again = agent_run(state, tmp_path, name="agent-a-wrong-key", env=env)
    try:
        refused = "control plane closed the tunnel: 4401 not authenticated: signature does not verify"
        wait_until(lambda: again.log().count(refused) >= 2, timeout=30, what="hello refused twice, with its reason")
        assert again.alive()  # 4401 is not 4403: the agent keeps trying
    finally:
        again.stop()
    assert "Traceback" not in control_plane.replicas[0].log()


def test_tunnels_spread_over_the_processes_of_one_replica_and_a_fan_out_reaches_them_all(
    tmp_path, settings, cluster, operator, agents, hub
):
    """uvicorn `--workers 2` (as the Procfile runs it, with one process per core): both processes accept on
    one socket, so agents' tunnels land in different processes, and a command to All nodes reaches each."""
    user, _ = operator
    settings.NODE_OFFLINE_AFTER_S = 3
    plane = ControlPlane(log_dir=tmp_path, env=subprocess_env(NODE_OFFLINE_AFTER_S="3"), server="uvicorn", workers=2)
    try:
        plane.start_replica()
        plane.start_worker()
        names: list[str] = []
        # which process accepts a connection is the kernel's choice: add agents until two processes hold some
        while len(names) < 8:
            names.append(f"w{len(names)}")
            agents(plane, cluster, user, names[-1])
            wait_until(
                lambda: (
                    Node.objects.filter(cluster=cluster, status="online").exclude(tunnel_inbox="").count() == len(names)
                ),
                timeout=30,
                what=f"{len(names)} nodes online",
            )
            inboxes = set(Node.objects.filter(cluster=cluster).values_list("tunnel_inbox", flat=True))
            if len(names) >= 3 and len(inboxes) >= 2:
                break
        assert len(inboxes) >= 2, f"all {len(names)} tunnels in one process: {inboxes}"
        commands = services.command_dispatch(
            actor=user, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}
        )
        assert len(commands) == len(names)
        wait_until(
            lambda: (
                Command.objects.filter(pk__in=[c.pk for c in commands], status="succeeded").count() == len(commands)
            ),
            timeout=90,
            what="every node's download succeeded",
        )
        assert len(hub.gets_of("weights.bin")) == len(names)  # each node ran it once
        assert "Traceback" not in plane.replicas[0].log(), plane.replicas[0].log()[-3000:]
    finally:
        plane.stop()

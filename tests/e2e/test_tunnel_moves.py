"""Make-before-break tunnel moves (docs/deploy.md: Upgrades): a web process asked to stop moves its
agents' tunnels to another replica before it goes, and the node never notices.

Real processes: two uvicorn web processes behind a real HAProxy with the compose stack's backend settings
(`tests.support.haproxy`), a Celery worker, one real agent dialing HAProxy, and an HTTP server on the
agent's "node" serving a slow event stream through a public endpoint. The replica holding the tunnel is
sent SIGTERM while a stream is open on its tunnel; a command is sent while the tunnel moves.
"""

from __future__ import annotations

import http.client
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent import protocol as p
from fleet import services
from fleet.models import Command, Node, NodeEvent
from fleet.workloads.models import Endpoint
from tests.e2e.conftest import node_of, wait_status
from tests.e2e.test_version_skew import agent_starter
from tests.support import haproxy
from tests.support.endpoints import endpoint_row
from tests.support.live import ControlPlane, subprocess_env
from tests.support.old_agent import protocol_tree
from tests.support.processes import ManagedProcess, free_port, port_open, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not haproxy.available(), reason="no haproxy installed (.ci/setup installs it)"),
]

EVENTS = 16  # 0.5 s apart: the stream outlives the drain's wait for the load balancer and the move

# The node's endpoint server: a process of its own whose command line names its port, as the agent's
# endpoint records expect (`agent.workloads.endpoints`); /health answers the agent's probes, /once holds
# its first request's answer for a minute and answers every later one at once (/hits: how many came), any
# other path is a slow event stream.
SLOW_EVENTS = f"""
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HITS = []

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, body):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self.answer(b"")
            return
        if self.path == "/hits":
            self.answer(str(len(HITS)).encode())
            return
        if self.path == "/once":
            HITS.append(time.time())
            if len(HITS) == 1:
                time.sleep(60)
            self.answer(b"answered request %d" % len(HITS))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range({EVENTS}):
            event = ("data: " + json.dumps({{"i": i}}) + "\\n\\n").encode()
            self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(event), event))
            self.wfile.flush()
            time.sleep(0.5)
        self.wfile.write(b"0\\r\\n\\r\\n")

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


@pytest.fixture
def slow_events(tmp_path):
    """(port, pid) of the endpoint server, stopped after the test."""
    script = tmp_path / "slow_events.py"
    script.write_text(SLOW_EVENTS)
    port = free_port()
    server = ManagedProcess("slow-events", [sys.executable, str(script), str(port)], log_dir=tmp_path)
    wait_until(lambda: port_open(port) or not server.alive(), timeout=15, what="the endpoint server")
    assert server.alive(), server.log()
    yield port, server.popen.pid
    server.stop()


def _endpoint_on_the_node(node: Node, state: Path, port: int, pid: int) -> Endpoint:
    """A running public endpoint on `node`, and the agent's record of its server (so its inventory keeps
    reporting it and the control plane keeps routing to it)."""
    endpoint = endpoint_row(cluster=node.cluster, node=node, model_id="t/m", status="running", port=port, public=True)
    records = state / "work" / "endpoints"
    records.mkdir(parents=True, exist_ok=True)
    record = {"model_id": "t/m", "port": port, "pid": pid, "status": "running"}
    (records / "endpoints.json").write_text(json.dumps({endpoint.slug: record}))
    return endpoint


@pytest.fixture
def pre_move_agent(tmp_path, hub):
    """Agents of the last protocol version before `Move` (`MOVE_SINCE - 1`), from this repository's history."""
    found = protocol_tree(tmp_path / "pre-move-agent", p.MOVE_SINCE - 1)
    if found is None:
        pytest.skip("no git history holding an agent from before the Move frame")
    yield from agent_starter(tmp_path, hub, found[0])


@pytest.fixture
def drain_deadline_s() -> str:
    return "20"


@pytest.fixture
def two_replicas(tmp_path, settings, drain_deadline_s):
    """Replica 0 started, replica 1's port reserved (started by the test), both behind HAProxy."""
    env = subprocess_env(WEB_DRAIN_LB_S="3", WEB_DRAIN_DEADLINE_S=drain_deadline_s)
    plane = ControlPlane(log_dir=tmp_path, env=env)
    ports = [free_port(), free_port()]
    plane.start_replica(ports[0])
    plane.start_worker()
    balancer = haproxy.LoadBalancer(tmp_path, ports)
    yield plane, balancer, ports
    balancer.stop()
    plane.stop()


def _watch_node(node: Node, stop: threading.Event, seen: list[tuple[str, bool, Any]]) -> None:
    """Record every (status, connected, tunnel session) the node's row shows until `stop`."""
    from django.db import connection

    try:
        while not stop.is_set():
            row = Node.objects.filter(pk=node.pk).values_list("status", "connected", "tunnel_session").first()
            if row is not None and (not seen or seen[-1] != row):
                seen.append(row)
            time.sleep(0.05)
    finally:
        connection.close()


def test_draining_the_replica_holding_a_tunnel_moves_it_once_without_a_gap(
    two_replicas, cluster, operator, agents, slow_events
):
    plane, balancer, ports = two_replicas
    user, _ = operator
    wait_until(lambda: balancer.servers_up() == {"web0"}, timeout=20, what="haproxy sees replica 0")
    port, pid = slow_events
    proc, state, _ = agents(
        plane, cluster, user, "m", url=balancer.url, extra_env={"CLEVERTHIS_PROXY_PORTS": str(port)}
    )
    node = node_of(state)
    wait_status(node, "online")
    endpoint = _endpoint_on_the_node(node, state, port, pid)
    # the second replica comes up; HAProxy checks it in
    plane.start_replica(ports[1])
    wait_until(lambda: balancer.servers_up() == {"web0", "web1"}, timeout=20, what="haproxy sees both replicas")
    assert proc.log().count("connected to") == 1

    seen: list[tuple[str, bool, Any]] = []
    stop_watching = threading.Event()
    watcher = threading.Thread(target=_watch_node, args=(node, stop_watching, seen), daemon=True)
    watcher.start()
    started = time.time()

    # a stream through HAProxy, on the tunnel replica 0 holds (directly, or over a peer link from replica 1)
    stream: dict[str, Any] = {}

    def read_stream() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", balancer.port, timeout=60)
        try:
            connection.request("GET", "/events", headers={"Host": endpoint.hostname})
            response = connection.getresponse()
            stream["status"] = response.status
            stream["body"] = response.read()
        except Exception as exc:  # reported by the assertions below
            stream["error"] = repr(exc)
        finally:
            connection.close()

    reader = threading.Thread(target=read_stream, daemon=True)
    reader.start()
    wait_until(lambda: "status" in stream or "error" in stream, timeout=15, what="the stream's response head")
    assert stream.get("status") == 200, stream

    old = plane.replicas[0]
    old.popen.send_signal(signal.SIGTERM)
    # during the move (the drain waits WEB_DRAIN_LB_S, then the agent moves within a second): a command
    wait_until(lambda: "asked this tunnel to move" in proc.log(), timeout=15, what="the agent asked to move")
    (command,) = services.command_dispatch(
        actor=user,
        cluster=cluster,
        command_type="model.download",
        payload={"model_id": "acme/tiny"},
        node=Node.objects.get(pk=node.pk),
    )
    try:
        wait_until(lambda: proc.log().count("connected to") == 2, timeout=20, what="the new tunnel")
        reader.join(timeout=30)
        old.popen.wait(timeout=30)  # it exits by itself once its tunnel and stream are gone
        wait_until(lambda: Command.objects.get(pk=command.pk).status == "succeeded", timeout=60, what="command ran")
        time.sleep(1.5)  # a late offline or a second reconnect would show by now
    finally:
        stop_watching.set()
        watcher.join(timeout=5)

    # the stream opened on the old tunnel completed: every event, no error
    assert "error" not in stream, stream
    events = [json.loads(line[6:]) for line in stream["body"].decode().split("\n") if line.startswith("data: ")]
    assert [e["i"] for e in events] == list(range(EVENTS))
    # exactly one reconnect, asked for; the old tunnel closed cleanly once its stream ended
    log = proc.log()
    assert log.count("connected to") == 2
    assert log.count("asked this tunnel to move") == 1
    assert "the tunnel that moved closed: control plane closed the tunnel: 1000 normal closure: tunnel moved" in log
    assert "reconnecting in" not in log, log[-3000:]
    # the node never read offline or disconnected; its tunnel holder switched exactly once
    assert {status for status, _, _ in seen} == {"online"}, seen
    assert all(connected for _, connected, _ in seen), seen
    assert len({session for _, _, session in seen}) == 2, seen
    assert not NodeEvent.objects.filter(node=node, kind="offline", created_at__gte=_aware(started)).exists()
    # the command sent during the move ran once (it may reach the agent over both tunnels while they
    # overlap, and again with the new tunnel's resend of unfinished commands: the agent runs its key once)
    assert log.count("command model.download succeeded in") == 1
    assert NodeEvent.objects.filter(command=command, kind="command.succeeded").count() == 1
    assert old.log().count("drained; stopping") == 1
    assert port_open(ports[1])


@pytest.mark.parametrize("drain_deadline_s", ["8"])
def test_a_request_whose_tunnel_closes_before_an_answer_is_sent_again_on_the_nodes_new_tunnel(
    two_replicas, cluster, operator, agents, slow_events
):
    """A request held on the old tunnel past the drain's deadline: the tunnel closes (1001) before any
    response byte, and the web process that took the request sends it again on the node's new tunnel (at
    the other replica, over a peer link), straight to the replica, without HAProxy."""
    plane, balancer, ports = two_replicas
    user, _ = operator
    wait_until(lambda: balancer.servers_up() == {"web0"}, timeout=20, what="haproxy sees replica 0")
    port, pid = slow_events
    proc, state, _ = agents(
        plane, cluster, user, "r", url=balancer.url, extra_env={"CLEVERTHIS_PROXY_PORTS": str(port)}
    )
    node = node_of(state)
    wait_status(node, "online")
    endpoint = _endpoint_on_the_node(node, state, port, pid)
    plane.start_replica(ports[1])
    wait_until(lambda: balancer.servers_up() == {"web0", "web1"}, timeout=20, what="haproxy sees both replicas")

    answer: dict[str, Any] = {}

    def request_at_replica_0() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", ports[0], timeout=90)
        try:
            connection.request("GET", "/once", headers={"Host": endpoint.hostname})
            response = connection.getresponse()
            answer["status"], answer["body"] = response.status, response.read()
        except Exception as exc:  # reported by the assertions below
            answer["error"] = repr(exc)
        finally:
            connection.close()

    def hits() -> int:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            connection.request("GET", "/hits")
            return int(connection.getresponse().read())
        finally:
            connection.close()

    requester = threading.Thread(target=request_at_replica_0, daemon=True)
    requester.start()
    wait_until(lambda: hits() == 1, timeout=15, what="the request at the node's server")
    old = plane.replicas[0]
    old.popen.send_signal(signal.SIGTERM)  # the tunnel moves; the held request keeps the old one to the deadline
    requester.join(timeout=60)
    old.popen.wait(timeout=30)

    assert answer.get("status") == 200, (answer, old.log()[-3000:])
    assert answer["body"] == b"answered request 2"
    assert hits() == 2
    assert "closing 1 tunnel(s) still open" in old.log()  # the deadline closed it under the request
    assert "closed before an answer (try 1)" in old.log()
    assert proc.log().count("asked this tunnel to move") == 1
    assert proc.log().count("connected to") == 2


def _aware(timestamp: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(timestamp, tz=UTC)


def test_an_agent_one_version_behind_reconnects_once_when_its_replica_drains_and_stays_online(
    two_replicas,
    cluster,
    operator,
    pre_move_agent,
):
    """An agent of protocol 5 knows no `Move`: its tunnel closes (1012) once idle and it reconnects as it
    always did, through HAProxy to the other replica, inside the offline grace."""
    plane, balancer, ports = two_replicas
    user, _ = operator
    cluster.auto_update_agents = False  # it stays an old agent
    cluster.save(update_fields=["auto_update_agents"])
    wait_until(lambda: balancer.servers_up() == {"web0"}, timeout=20, what="haproxy sees replica 0")
    proc, state = pre_move_agent(balancer.url, cluster, user, "old")
    node = node_of(state)
    wait_status(node, "online", timeout=60)
    assert Node.objects.get(pk=node.pk).protocol_version == p.MOVE_SINCE - 1
    plane.start_replica(ports[1])
    wait_until(lambda: balancer.servers_up() == {"web0", "web1"}, timeout=20, what="haproxy sees both replicas")

    seen: list[tuple[str, bool, Any]] = []
    stop_watching = threading.Event()
    watcher = threading.Thread(target=_watch_node, args=(node, stop_watching, seen), daemon=True)
    watcher.start()
    started = time.time()
    try:
        plane.replicas[0].popen.send_signal(signal.SIGTERM)
        wait_until(lambda: proc.log().count("connected to") == 2, timeout=30, what="the old agent's reconnect")
        plane.replicas[0].popen.wait(timeout=30)
        time.sleep(1.5)
    finally:
        stop_watching.set()
        watcher.join(timeout=5)
    assert "1012" in proc.log(), proc.log()
    assert proc.log().count("connected to") == 2
    assert {status for status, _, _ in seen} == {"online"}, seen
    assert not NodeEvent.objects.filter(node=node, kind="offline", created_at__gte=_aware(started)).exists()

"""Rolling deploys: a control plane of this release with a real agent of the previous protocol version.

The old agent is the previous release's own code, extracted from this repository's history
(`tests.support.old_agent`): it sends no protocol range, decodes only its own version and refuses
frames with fields it does not know. The real web server, Celery worker, PostgreSQL and Redis.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from agent import protocol as p
from fleet import services
from fleet.models import Command, Node, NodeEvent
from tests.e2e.conftest import node_of, wait_status
from tests.support.endpoints import endpoint_row
from tests.support.live import ControlPlane, subprocess_env
from tests.support.old_agent import old_agent_join, old_agent_run, previous_protocol_tree
from tests.support.processes import free_port, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def old_tree(tmp_path):
    found = previous_protocol_tree(tmp_path / "old-agent")
    if found is None:
        pytest.skip("no git history holding the previous protocol version's agent")
    return found[0]


def agent_starter(tmp_path, hub, tree):
    """Start agents of the old `tree` (join, then run as a managed process); stops them when done."""
    started = []

    def start(url: str, cluster, user, name: str, extra_env: dict[str, str] | None = None):
        _, raw = services.join_token_create(cluster=cluster, actor=user)
        state = tmp_path / f"state-{name}"
        joined = old_agent_join(tree, url, raw, state)
        assert joined.returncode == 0, joined.stderr
        env = {"CLEVERTHIS_MODEL_CACHE": str(tmp_path / f"models-{name}"), "HF_ENDPOINT": hub.url, **(extra_env or {})}
        proc = old_agent_run(tree, state, tmp_path, name=f"old-agent-{name}", env=env)
        started.append(proc)
        return proc, state

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def old_agent(tmp_path, hub, old_tree):
    yield from agent_starter(tmp_path, hub, old_tree)


def test_an_agent_one_protocol_version_behind_keeps_working_and_is_asked_to_update(
    control_plane, cluster, operator, old_agent
):
    user, _ = operator
    proc, state = old_agent(control_plane.url, cluster, user, "old")
    node = node_of(state)
    wait_status(node, "online", timeout=60)
    wait_until(lambda: "heartbeat sent" in proc.log(), timeout=30, what="heartbeat of the old agent")
    node.refresh_from_db()
    assert node.connected
    assert node.protocol_version == p.PROTOCOL_VERSION - 1
    outdated = NodeEvent.objects.get(node=node, kind="agent.outdated")
    assert "re-running the install script" in outdated.message

    # commands still run on the old agent (encoded at its version by the control plane)
    (download,) = services.command_dispatch(
        actor=user, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}, node=node
    )
    wait_until(
        lambda: Command.objects.get(pk=download.pk).status in ("succeeded", "failed"), timeout=90, what="download"
    )
    download.refresh_from_db()
    assert download.status == "succeeded", (download.error_message, proc.log()[-3000:])
    assert "malformed" not in proc.log()  # nothing the control plane sent was refused by the old decoder


@pytest.fixture
def strict_control_plane(tmp_path, settings):
    """A control plane that accepts only agents of its own protocol version (AGENT_PROTOCOL_MIN)."""
    settings.NODE_OFFLINE_AFTER_S = 3
    plane = ControlPlane(
        log_dir=tmp_path, env=subprocess_env(NODE_OFFLINE_AFTER_S="3", AGENT_PROTOCOL_MIN=str(p.PROTOCOL_VERSION))
    )
    plane.start_replica()
    plane.start_worker()
    yield plane
    plane.stop()


def test_an_agent_too_old_is_refused_with_a_reason_and_an_event_saying_what_to_do(
    strict_control_plane, cluster, operator, old_agent
):
    user, _ = operator
    proc, state = old_agent(strict_control_plane.url, cluster, user, "too-old")
    node = node_of(state)
    wait_until(
        lambda: NodeEvent.objects.filter(node=node, kind="agent.too_old").exists(), timeout=60, what="refusal event"
    )
    event = NodeEvent.objects.filter(node=node, kind="agent.too_old").first()
    assert f"protocol {p.PROTOCOL_VERSION - 1}" in event.message
    assert "re-running the install script" in event.message
    # the old agent logs the reason as it got it, and the close code (a protocol-1 agent) or its meaning
    # (from protocol 2 on, an agent handles 4426 itself: "too old for the control plane", retry later)
    wait_until(lambda: "re-run the install script" in proc.log(), timeout=30, what="close logged by the agent")
    assert str(p.CLOSE_AGENT_TOO_OLD) in proc.log() or "too old for the control plane" in proc.log()
    assert not Node.objects.get(pk=node.pk).connected


class TokenStream(BaseHTTPRequestHandler):
    """A server-sent-events answer of ten events, each flushed on its own (one stream chunk each)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for index in range(10):
            self.wfile.write(f"data: token {index}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.01)
        self.close_connection = True


def test_an_agent_one_protocol_version_behind_still_proxies_a_streamed_answer_with_its_own_frames(
    control_plane, cluster, operator, old_agent
):
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), TokenStream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        user, _ = operator
        # the old agent stays old: an automatic update restarting it mid-request would break the stream
        cluster.auto_update_agents = False
        cluster.save(update_fields=["auto_update_agents"])
        proc, state = old_agent(control_plane.url, cluster, user, "old-proxy", {"CLEVERTHIS_PROXY_PORTS": str(port)})
        node = node_of(state)
        wait_status(node, "online", timeout=60)
        node.refresh_from_db()
        assert node.protocol_version == p.PROTOCOL_VERSION - 1
        endpoint = endpoint_row(cluster=cluster, node=node, model_id="t/m", status="running", port=port, public=True)
        answer = requests.get(f"{control_plane.url}/stream", headers={"Host": endpoint.hostname}, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.text == "".join(f"data: token {index}\n\n" for index in range(10))
        assert "malformed" not in proc.log()  # nothing the control plane sent was refused by the old decoder
    finally:
        server.shutdown()
        server.server_close()

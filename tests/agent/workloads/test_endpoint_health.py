"""Health probes of endpoint servers: a server that hangs (process alive, connection accepted, no answer)
is reported unresponsive after the failures in a row, answers again → running; the tunnel reports the
inventory at once; a stopped (SIGSTOP) server is ended by stop."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent import identity
from agent import protocol as p
from agent.config import AgentConfig
from agent.protocol import EndpointStartPayload, EndpointStopPayload
from agent.transport.tunnel import TunnelClient
from agent.workloads.endpoint_health import EndpointProber, HealthSettings, probe
from agent.workloads.server_process import pid_alive as _pid_alive
from tests.agent.workloads import test_endpoints
from tests.agent.workloads.test_endpoints import MODEL, quiet

# EndpointManager with the stand-in server, as the manager's own tests use it
cached_models = test_endpoints.cached_models
manager = test_endpoints.manager

FAST = HealthSettings(interval_s=0.05, timeout_s=0.3, failures=2)


@pytest.fixture
def hung_port() -> Iterator[int]:
    """A port whose socket accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


@pytest.fixture
def status_server() -> Iterator[tuple[int, list[int]]]:
    """An HTTP server answering GET /health with the status at the end of the returned list."""
    statuses = [200]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(statuses[-1] if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], statuses
    server.shutdown()
    server.server_close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_probe_passes_on_2xx_only_and_fails_on_a_hung_or_closed_port(hung_port, status_server):
    port, statuses = status_server
    assert asyncio.run(probe(port, 2.0)) is True
    statuses.append(503)
    assert asyncio.run(probe(port, 2.0)) is False
    assert asyncio.run(probe(hung_port, 0.2)) is False  # connected, never answered: the timeout ends it
    assert asyncio.run(probe(free_port(), 2.0)) is False  # nothing listens


class FakeManager:
    """Servers on ports with a status each, as EndpointManager keeps them."""

    def __init__(self, ports: dict[str, int]) -> None:
        self.ports = ports
        self.status = dict.fromkeys(ports, "running")

    def health_targets(self) -> list[tuple[str, int]]:
        return sorted(self.ports.items())

    def mark_health(self, endpoint_id: str, healthy: bool) -> bool:
        wanted = "running" if healthy else "unresponsive"
        changed = self.status[endpoint_id] != wanted
        self.status[endpoint_id] = wanted
        return changed

    def inventory(self) -> list[p.EndpointInfo]:
        return [
            p.EndpointInfo(endpoint_id=e, model_id=MODEL, port=port, status=self.status[e])
            for e, port in sorted(self.ports.items())
        ]


def test_the_prober_marks_a_server_unresponsive_after_the_failures_in_a_row_and_running_when_it_answers(
    hung_port, status_server
):
    good, statuses = status_server
    fake = FakeManager({"good": good, "hung": hung_port})
    prober = EndpointProber(FAST)
    assert asyncio.run(prober.check(fake)) is False  # one failure: not yet
    assert fake.status == {"good": "running", "hung": "running"}
    assert asyncio.run(prober.check(fake)) is True  # the second in a row
    assert fake.status == {"good": "running", "hung": "unresponsive"}
    assert asyncio.run(prober.check(fake)) is False  # still hung: nothing new to report

    statuses.append(500)  # one failure of the good one, then it answers again: its count starts over
    assert asyncio.run(prober.check(fake)) is False
    statuses.append(200)
    assert asyncio.run(prober.check(fake)) is False
    statuses.append(500)
    assert asyncio.run(prober.check(fake)) is False
    assert fake.status["good"] == "running"

    statuses.append(200)
    fake.ports["hung"] = good  # the hung one answers again
    assert asyncio.run(prober.check(fake)) is True
    assert fake.status == {"good": "running", "hung": "running"}


def test_settings_come_from_the_environment_and_bad_values_take_the_defaults():
    env = {
        "CLEVERTHIS_ENDPOINT_HEALTH_INTERVAL_S": "0.5",
        "CLEVERTHIS_ENDPOINT_HEALTH_TIMEOUT_S": "2",
        "CLEVERTHIS_ENDPOINT_HEALTH_FAILURES": "4",
    }
    assert HealthSettings.from_env(env) == HealthSettings(interval_s=0.5, timeout_s=2.0, failures=4)
    bad = {
        "CLEVERTHIS_ENDPOINT_HEALTH_INTERVAL_S": "soon",
        "CLEVERTHIS_ENDPOINT_HEALTH_TIMEOUT_S": "-1",
        "CLEVERTHIS_ENDPOINT_HEALTH_FAILURES": "0",
    }
    assert HealthSettings.from_env(bad) == HealthSettings() == HealthSettings(5.0, 5.0, 3)


def test_a_stopped_server_is_reported_unresponsive_then_running_again_when_it_continues(manager):
    result = manager.start(EndpointStartPayload(endpoint_id="ep1", model_id=MODEL), quiet)
    pid = result.pid
    prober = EndpointProber(FAST)
    os.kill(pid, signal.SIGSTOP)
    try:
        assert asyncio.run(prober.check(manager)) is False
        assert asyncio.run(prober.check(manager)) is True
        [info] = manager.inventory()
        assert (info.endpoint_id, info.status, info.pid) == ("ep1", "unresponsive", pid)
        assert manager.health_targets() == [("ep1", result.port)]  # still probed: it may answer again
    finally:
        os.kill(pid, signal.SIGCONT)
    assert asyncio.run(prober.check(manager)) is True
    assert [i.status for i in manager.inventory()] == ["running"]


def test_stop_ends_a_stopped_server_woken_to_take_its_sigterm(manager):
    result = manager.start(EndpointStartPayload(endpoint_id="ep1", model_id=MODEL), quiet)
    pid = result.pid
    child = manager.processes.children[pid]
    manager.stop_timeout_s = 60.0
    os.kill(pid, signal.SIGSTOP)
    try:
        manager.stop(EndpointStopPayload(endpoint_id="ep1"))
    finally:
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert not _pid_alive(pid)
    assert child.returncode == -signal.SIGTERM  # woken by SIGCONT, it ended on SIGTERM (no SIGKILL needed)
    assert manager.inventory() == []
    assert manager.health_targets() == []


def test_starting_an_endpoint_whose_server_hangs_replaces_the_server(manager):
    first = manager.start(EndpointStartPayload(endpoint_id="ep1", model_id=MODEL), quiet)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        assert manager.mark_health("ep1", healthy=False) is True
        again = manager.start(EndpointStartPayload(endpoint_id="ep1", model_id=MODEL), quiet)
    finally:
        if _pid_alive(first.pid):
            os.kill(first.pid, signal.SIGKILL)
    assert again.pid != first.pid
    assert not _pid_alive(first.pid)
    assert [(i.pid, i.status) for i in manager.inventory()] == [(again.pid, "running")]


def test_mark_health_leaves_starting_and_stopped_records_alone(manager):
    manager.start(EndpointStartPayload(endpoint_id="ep1", model_id=MODEL), quiet)
    manager.stop(EndpointStopPayload(endpoint_id="ep1"))
    assert manager.mark_health("ep1", healthy=False) is False
    assert manager.mark_health("nope", healthy=False) is False
    assert manager._load()["ep1"]["status"] == "stopped"


class Runner:
    """A runner whose endpoints are a FakeManager."""

    def __init__(self, endpoints: FakeManager) -> None:
        self.endpoints = endpoints

    def inventory(self, gpus: list[p.GpuInfo]) -> p.Inventory:
        return p.Inventory(gpus=gpus, endpoints=self.endpoints.inventory())

    def proxy_ports(self) -> set[int]:
        return set(self.endpoints.ports.values())


class OneRound:
    """A frame sender stand-in that closes after `rounds` looks at it (the health loop then ends)."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    @property
    def closed(self) -> bool:
        self.rounds -= 1
        return self.rounds < 0


def test_the_tunnel_reports_the_inventory_as_soon_as_a_server_is_unresponsive(tmp_path: Path, hung_port):
    config = AgentConfig(
        control_plane_url="http://cp.invalid",
        node_id="00000000-0000-0000-0000-000000000001",
        tunnel_path=p.TUNNEL_PATH,
        heartbeat_interval_s=30,
        state_dir=str(tmp_path),
    )
    identity.write_private_key(identity.generate_key(), config.key_path)
    config.cert_path.write_text("certificate")
    config.ca_path.write_text("ca")
    runner = Runner(FakeManager({"ep1": hung_port}))
    client = TunnelClient(config, lambda mode, settings: runner, prober=EndpointProber(FAST))
    client.runner = runner  # type: ignore[assignment]
    client._reported_inventory = runner.inventory([])
    sent: list[p.Frame] = []
    client._send = sent.append  # type: ignore[method-assign]

    asyncio.run(client._endpoint_health(OneRound(1)))  # type: ignore[arg-type]
    assert sent == []  # one failure: nothing to say yet
    asyncio.run(client._endpoint_health(OneRound(1)))  # type: ignore[arg-type]
    [report] = sent
    assert isinstance(report, p.InventoryReport)
    assert [(e.endpoint_id, e.status) for e in report.inventory.endpoints] == [("ep1", "unresponsive")]

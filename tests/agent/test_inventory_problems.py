"""The agent reports what it cannot read (issue 35: a kubernetes node without credentials showed Online with
0 containers and no warning): `Inventory.problems`, new in protocol 4 and left out for older peers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent import protocol as p
from agent.executors.kubernetes import KubernetesExecutor
from agent.runner import CommandRunner
from agent.workloads.endpoints import EndpointManager
from agent.workloads.models import ModelCache
from tests.agent.test_inventory_reports import _client


@pytest.fixture
def no_kube_credentials(monkeypatch, tmp_path):
    for name in ("CLEVERTHIS_KUBECONFIG", "KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.kube/config


def _runner(tmp_path: Path) -> CommandRunner:
    models = ModelCache(tmp_path / "models")
    return CommandRunner(
        executor=KubernetesExecutor(),
        models=models,
        endpoints=EndpointManager(models, tmp_path / "endpoints"),
        journal_path=tmp_path / "journal.jsonl",
    )


def test_a_kubernetes_executor_without_credentials_is_an_inventory_problem(no_kube_credentials, tmp_path):
    inventory = _runner(tmp_path).inventory([])
    assert inventory.containers == []
    [problem] = inventory.problems
    assert problem.part == "containers"
    assert problem.code == "kubernetes_unavailable"
    assert "cannot load Kubernetes credentials (in-cluster configuration)" in problem.message


def test_problems_travel_from_protocol_4_and_are_left_out_for_older_peers():
    problem = p.InventoryProblem(part="containers", code="kubernetes_unavailable", message="no credentials")
    report = p.InventoryReport(inventory=p.Inventory(problems=[problem]))
    assert p.INVENTORY_PROBLEMS_SINCE == 4 <= p.PROTOCOL_VERSION
    assert p.decode(p.encode(report)).inventory.problems == [problem]
    for older in (2, 3):
        raw = p.encode(p.at_version(report, older))
        assert "problems" not in raw  # an older control plane would refuse the unknown field
        assert p.decode(raw).inventory.problems == []
    hello_of_an_old_agent = p.encode(
        p.at_version(p.Hello(node_id="n", certificate_pem="c", signature_b64="s", facts=p.HostFacts(hostname="h")), 3)
    )
    assert p.decode(hello_of_an_old_agent).inventory.problems == []


class _Sender:
    """A frame sender that closes after one heartbeat."""

    def __init__(self) -> None:
        self.closed = False
        self.frames: list[p.Frame] = []

    def send(self, frame: p.Frame) -> None:
        self.frames.append(frame)
        self.closed = isinstance(frame, p.Heartbeat)


def test_a_problem_that_appears_or_clears_between_commands_is_reported_with_the_next_heartbeat(tmp_path):
    client, runner, sent = _client(tmp_path)
    problem = p.InventoryProblem(part="containers", code="kubernetes_unavailable", message="no credentials")
    problems: list[p.InventoryProblem] = []
    runner.inventory = lambda gpus: p.Inventory(gpus=gpus, problems=list(problems))  # type: ignore[method-assign]
    client._reported_inventory = runner.inventory([])  # the Hello's: no problem yet

    asyncio.run(client._heartbeats(_Sender(), 0))
    assert sent == []  # nothing changed: no report

    problems.append(problem)
    asyncio.run(client._heartbeats(_Sender(), 0))
    assert [type(f) for f in sent] == [p.InventoryReport]
    assert sent[0].inventory.problems == [problem]

    sent.clear()  # the same problem, another message: not reported again
    problems[0] = p.InventoryProblem(part="containers", code="kubernetes_unavailable", message="still none")
    asyncio.run(client._heartbeats(_Sender(), 0))
    assert sent == []

    problems.clear()  # fixed: the control plane hears it at once
    asyncio.run(client._heartbeats(_Sender(), 0))
    assert [type(f) for f in sent] == [p.InventoryReport]
    assert sent[0].inventory.problems == []

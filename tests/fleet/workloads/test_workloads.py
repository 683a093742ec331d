"""Containers and cached models reconciled from agent inventories; command outcomes; error help."""

from __future__ import annotations

import pytest

from agent import protocol
from fleet import services
from fleet.models import NodeEvent
from fleet.workloads import errors as workload_errors
from fleet.workloads import services as workload_services
from fleet.workloads.models import Container, ContainerStatus, NodeModel
from tests.fleet import agent_side
from tests.fleet.agent_side import running

pytestmark = pytest.mark.django_db

CREATE = {"image": "nginx:1.27", "name": "web", "memory_mb": 512, "cpu": 1}


def test_reconcile_inserts_updates_and_marks_missing(node):
    agent_side.inventory(node, containers=[running("a", "c1"), running("b", "c2", status="exited")])
    rows = {c.name: c for c in Container.objects.filter(node=node)}
    assert {n: r.status for n, r in rows.items()} == {"a": "running", "b": "exited"}
    assert rows["a"].cluster_id == node.cluster_id
    node.refresh_from_db()
    assert node.containers_count == 1  # only active containers count

    agent_side.inventory(node, containers=[running("a", "c1", status="exited")])
    rows = {c.name: c for c in Container.objects.filter(node=node)}
    assert rows["a"].status == ContainerStatus.EXITED
    assert rows["b"].status == ContainerStatus.MISSING
    assert Container.objects.filter(node=node).count() == 2  # updated in place, no duplicates
    node.refresh_from_db()
    assert node.containers_count == 0
    assert NodeEvent.objects.filter(node=node, kind="container.missing").exists()


def test_reconcile_is_idempotent_and_constant_in_queries(node, django_assert_max_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def report(n: int) -> protocol.Inventory:
        return protocol.Inventory(containers=[running(f"w{i}", f"id{i}") for i in range(n)])

    with CaptureQueriesContext(connection) as few:
        workload_services.containers_reconcile(node=node, inventory=report(2))
    with CaptureQueriesContext(connection) as many:
        workload_services.containers_reconcile(node=node, inventory=report(40))
    assert len(many) == len(few)
    before = list(Container.objects.filter(node=node).order_by("name").values_list("pk", "status", "updated_at"))
    with django_assert_max_num_queries(len(few)):
        out = workload_services.containers_reconcile(node=node, inventory=report(40))
    assert out == {"created": 0, "updated": 0, "missing": 0}
    after = list(Container.objects.filter(node=node).order_by("name").values_list("pk", "status", "updated_at"))
    assert after == before


def test_reconcile_updates_and_missing_marks_are_constant_in_queries(cluster, register_node):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    counts = []
    for n, name in ((2, "small"), (30, "large")):
        node = register_node(cluster, name)
        workload_services.containers_reconcile(
            node=node, inventory=protocol.Inventory(containers=[running(f"w{i}", f"id{i}") for i in range(2 * n)])
        )
        # Half change status, half disappear.
        changed = protocol.Inventory(containers=[running(f"w{i}", f"id{i}", status="exited") for i in range(n)])
        with CaptureQueriesContext(connection) as queries:
            out = workload_services.containers_reconcile(node=node, inventory=changed)
        assert out == {"created": 0, "updated": n, "missing": n}
        counts.append(len(queries))
        statuses = set(Container.objects.filter(node=node).values_list("status", flat=True))
        assert statuses == {"exited", "missing"}
    assert counts[0] == counts[1]


def test_create_result_fills_the_row_made_at_dispatch_and_inventory_matches_by_key(node, cluster, owner):
    (command,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="container.create", payload=CREATE, node=node
    )
    agent_side.result(command, container_id="abc123")
    row = Container.objects.get(node=node)
    assert (row.container_id, row.status, row.image, row.name) == ("abc123", "running", "nginx:1.27", "web")
    assert row.spec["memory_mb"] == 512
    assert row.created_by_command_id == command.pk
    assert row.command_key == command.idempotency_key
    # The agent's next inventory carries the same container: matched, not duplicated.
    agent_side.inventory(node, containers=[running("web", "abc123", key=command.idempotency_key)])
    assert Container.objects.filter(node=node).count() == 1
    node.refresh_from_db()
    assert node.containers_count == 1


def test_inventory_before_result_matches_by_command_key(node, cluster, owner):
    (command,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="container.create", payload=CREATE, node=node
    )
    agent_side.inventory(node, containers=[running("web", "zzz", key=command.idempotency_key)])
    agent_side.result(command, container_id="zzz")
    (row,) = Container.objects.filter(node=node)
    assert row.created_by_command_id == command.pk
    assert row.spec["cpu"] == 1


def test_failed_create_is_explained_in_events(node, cluster, owner):
    (command,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="container.create", payload=CREATE, node=node
    )
    agent_side.error(command, "image_pull_failed", "manifest for nginx:9 not found")
    event = NodeEvent.objects.get(node=node, kind="container.failed")
    assert "Image pull failed" in event.message
    assert "manifest for nginx:9 not found" in event.message
    assert "Fix:" in event.message
    assert event.data["error_help"]["code"] == "image_pull_failed"


def test_stop_and_destroy_outcomes_update_the_row(node, cluster, owner):
    agent_side.inventory(node, containers=[running("web", "c1")])
    (stop,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="container.stop", payload={"container": "c1"}, node=node
    )
    agent_side.result(stop)
    assert Container.objects.get(node=node).status == ContainerStatus.STOPPED
    (destroy,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="container.destroy", payload={"container": "web"}, node=node
    )
    agent_side.result(destroy)
    assert Container.objects.get(node=node).status == ContainerStatus.REMOVED


@pytest.mark.parametrize("code", protocol.ERROR_CODES)
def test_every_agent_error_code_has_a_specific_explanation_and_fix(code):
    help_ = workload_errors.error_help(code)
    assert help_["code"] == code
    assert all(help_[k] for k in ("title", "explanation", "fix"))
    assert not help_["title"].startswith("Error ")  # not the generic fallback


def test_documented_failures_have_the_documented_meaning():
    assert "Docker" in workload_errors.error_help("docker_unavailable")["title"]
    assert "model.download" in workload_errors.error_help("weights_missing")["fix"]
    assert "VRAM" in workload_errors.error_help("insufficient_vram")["explanation"]
    assert workload_errors.error_help("") is None
    assert workload_errors.error_help("something_new")["title"] == "Error something_new"


def test_model_cache_reconciled(cluster, register_node):
    a = register_node(cluster, "a")
    b = register_node(cluster, "b")
    llama = protocol.CachedModel(model_id="meta/llama", revision="main", path="/cache/llama", size_bytes=10)
    agent_side.inventory(a, models=[llama, protocol.CachedModel(model_id="org/tiny", revision="v1", path="/c/t")])
    agent_side.inventory(b, models=[llama])
    rows = NodeModel.objects.filter(model_id="meta/llama")
    assert sorted(r.node.name for r in rows) == ["a", "b"]
    assert NodeModel.objects.count() == 3
    # Reconcile again with one model gone and one changed: exact, idempotent.
    bigger = protocol.CachedModel(model_id="meta/llama", revision="main", path="/cache/llama", size_bytes=99)
    agent_side.inventory(a, models=[bigger])
    agent_side.inventory(a, models=[bigger])
    assert list(NodeModel.objects.filter(node=a).values_list("model_id", "size_bytes")) == [("meta/llama", 99)]

"""The real drain: replacements on fitting nodes, originals stopped only after them, cordon at the end."""

from __future__ import annotations

import pytest

from agent import protocol
from fleet import services
from fleet.models import Command, CommandStatus, NodeEvent, NodeStatus
from fleet.payloads import MASK
from fleet.workloads import drain
from fleet.workloads.models import Container, ContainerStatus
from fleet.workloads.tasks import drain_node_now, drain_tick
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db


def busy(node, used_mb: int) -> None:
    """A heartbeat reporting `used_mb` of memory in use."""
    services.node_record_heartbeat(
        node_id=node.pk, heartbeat=protocol.Heartbeat(cpu_percent=10, memory_percent=50, memory_used_mb=used_mb)
    )


def run_container(owner, node, name: str, **spec) -> Container:
    """container.create on `node` answered by the agent with a running container."""
    payload = {"image": "nginx:1.27", "name": name, **spec}
    (command,) = services.command_dispatch(
        actor=owner, cluster=node.cluster, command_type="container.create", payload=payload, node=node
    )
    agent_side.result(command, container_id=f"cid-{name}-{node.name}")
    return Container.objects.get(created_by_command=command)


@pytest.fixture
def trio(cluster, register_node):
    return register_node(cluster, "a"), register_node(cluster, "b"), register_node(cluster, "c")


def test_full_drain_moves_to_the_fitting_node_then_stops_the_original_then_cordons(owner, trio):
    a, b, c = trio
    busy(b, 63800)  # b has 200 MB free: does not fit 1024 MB
    web = run_container(owner, a, "web", memory_mb=1024, cpu=2, env={"MODE": "prod"})
    a = services.node_drain(node=a, actor=owner)
    assert a.status == NodeStatus.DRAINING

    report = drain.drain_step(node_id=a.pk)
    assert [r["name"] for r in report.replacing] == ["web"]
    rep = Container.objects.get(replacement_of=web)
    assert (rep.node_id, rep.status, rep.name) == (c.pk, ContainerStatus.PENDING, "web-r1")
    create = rep.created_by_command
    assert create.command_type == "container.create"
    assert create.node_id == c.pk
    assert create.wire_payload()["env"] == {"MODE": "prod"}  # env values are secret: only the agent sees them
    assert create.payload["env"] == {"MODE": MASK}
    assert create.payload["memory_mb"] == 1024
    assert create.payload["labels"] == {drain.REPLACEMENT_LABEL: str(web.pk)}
    assert not Command.objects.filter(command_type="container.stop").exists()

    # Repeating the step while the replacement is pending changes nothing.
    again = drain.drain_step(node_id=a.pk)
    assert [w["name"] for w in again.waiting] == ["web"]
    assert Container.objects.filter(replacement_of=web).count() == 1
    assert not Command.objects.filter(command_type="container.stop").exists()

    # The agent on c reports the replacement running: the original's graceful stop goes out.
    agent_side.result(create, container_id="cid-web-r1")
    rep.refresh_from_db()
    web.refresh_from_db()
    assert rep.status == ContainerStatus.RUNNING
    assert web.status == ContainerStatus.STOPPING
    stop = Command.objects.get(command_type="container.stop")
    assert stop.node_id == a.pk
    assert stop.payload == {"container": "cid-web-a", "timeout_s": drain.STOP_TIMEOUT_S}
    a.refresh_from_db()
    assert a.status == NodeStatus.DRAINING

    agent_side.result(stop)
    web.refresh_from_db()
    a.refresh_from_db()
    assert web.status == ContainerStatus.STOPPED
    assert a.status == NodeStatus.CORDONED
    assert a.containers_count == 0
    kinds = list(NodeEvent.objects.filter(node=a).order_by("created_at").values_list("kind", flat=True))
    for kind in ("draining", "drain.replacing", "drain.stopping", "drained"):
        assert kind in kinds
    assert NodeEvent.objects.filter(node=c, kind="drain.replacement").exists()


def test_replacement_gets_the_secrets_and_marks_of_the_original(owner, trio):
    a, _b, _c = trio
    web = run_container(
        owner,
        a,
        "web",
        env={"HF_TOKEN": "hf_moving"},
        command=["serve", "--key", "k-moving"],
        secret_fields=["command"],
        registry_password="reg-pw",
    )
    services.node_drain(node=a, actor=owner)
    drain.drain_step(node_id=a.pk)
    create = Container.objects.get(replacement_of=web).created_by_command
    wire = create.wire_payload()
    assert wire["env"] == {"HF_TOKEN": "hf_moving"}
    assert wire["command"] == ["serve", "--key", "k-moving"]
    assert wire["registry_password"] == "reg-pw"
    assert create.payload["env"] == {"HF_TOKEN": MASK}
    assert create.payload["command"] == [MASK, MASK, MASK]
    assert "registry_password" not in create.payload


def test_no_replacement_with_masks_when_the_create_command_is_gone(owner, trio):
    a, _b, _c = trio
    web = run_container(owner, a, "web", env={"HF_TOKEN": "hf_gone"})
    Command.objects.filter(pk=web.created_by_command_id).delete()
    services.node_drain(node=a, actor=owner)
    report = drain.drain_step(node_id=a.pk)
    assert [b["reason"] for b in report.blocked] == [
        "cannot replace web: its secret values went with its deleted create command"
    ]
    assert not Container.objects.filter(replacement_of=web).exists()
    assert not Command.objects.filter(command_type="container.create").exists()


def test_no_fitting_node_keeps_the_container_and_reports_it_once(owner, trio):
    a, _b, _c = trio
    big = run_container(owner, a, "big", memory_mb=500000)
    services.node_drain(node=a, actor=owner)
    first = drain.drain_step(node_id=a.pk)
    second = drain_node_now(str(a.pk))
    for report in (first, second):
        blocked = report.blocked if hasattr(report, "blocked") else report["blocked"]
        assert len(blocked) == 1
        assert blocked[0]["reason"] == "no node fits big (needs memory 500000 MB, cpu 0, gpus 0)"
    big.refresh_from_db()
    a.refresh_from_db()
    assert big.status == ContainerStatus.RUNNING
    assert a.status == NodeStatus.DRAINING
    assert not Command.objects.filter(command_type__in=["container.stop", "container.destroy"]).exists()
    assert Container.objects.filter(replacement_of=big).count() == 0
    events = NodeEvent.objects.filter(node=a, kind="drain.no_fit")
    assert events.count() == 1
    assert "no node fits big" in events.get().message


def test_target_choice_skips_cordoned_nodes_and_busy_gpus_and_prefers_least_loaded(owner, cluster, register_node):
    a, b, c, d = (register_node(cluster, n) for n in "abcd")
    run_container(owner, b, "gpu-user", gpus=1)  # b's only GPU is taken
    run_container(owner, c, "x1")
    run_container(owner, c, "x2")
    services.node_cordon(node=d, actor=owner)  # d is empty but cordoned
    train = run_container(owner, a, "train", gpus=1)
    svc = run_container(owner, a, "svc")
    services.node_drain(node=a, actor=owner)
    report = drain.drain_step(node_id=a.pk)
    targets = {r["name"]: r["target"] for r in report.replacing}
    assert targets["train"] == str(c.pk)  # only c has a free GPU
    # svc: b and c now each hold 1 / 3 active containers; b is the least loaded.
    assert targets["svc"] == str(b.pk)
    assert Container.objects.get(replacement_of=svc).node_id == b.pk
    assert Container.objects.get(replacement_of=train).node_id == c.pk


def test_failed_replacement_is_retried_then_given_up_with_the_agents_reason(owner, trio):
    a, _b, _c = trio
    web = run_container(owner, a, "web")
    services.node_drain(node=a, actor=owner)
    for attempt in range(1, drain.MAX_REPLACEMENT_ATTEMPTS + 1):
        drain.drain_step(node_id=a.pk)
        rep = Container.objects.filter(replacement_of=web).order_by("-created_at").first()
        assert rep.name == f"web-r{attempt}"
        agent_side.error(rep.created_by_command, "image_pull_failed", "registry timeout")
        rep.refresh_from_db()
        assert rep.status == ContainerStatus.FAILED
        assert rep.error_code == "image_pull_failed"
    report = drain.drain_step(node_id=a.pk)
    assert len(report.blocked) == 1
    assert "Image pull failed" in report.blocked[0]["reason"]
    web.refresh_from_db()
    assert web.status == ContainerStatus.RUNNING
    assert Container.objects.filter(replacement_of=web).count() == drain.MAX_REPLACEMENT_ATTEMPTS


def test_failed_stop_is_retried_and_not_found_counts_as_gone(owner, trio):
    a, _b, _c = trio
    web = run_container(owner, a, "web")
    services.node_drain(node=a, actor=owner)
    drain.drain_step(node_id=a.pk)
    rep = Container.objects.get(replacement_of=web)
    agent_side.result(rep.created_by_command, container_id="r1")
    first_stop = Command.objects.get(command_type="container.stop")
    agent_side.error(first_stop, "docker_unavailable", "Cannot connect to the Docker daemon")
    assert NodeEvent.objects.filter(node=a, kind="container.failed", message__contains="Docker is not running")
    # The failure's hook ran the next pass at once: a fresh stop is queued (bounded by MAX_STOP_ATTEMPTS).
    drain.drain_step(node_id=a.pk)  # and another pass does not send a second one
    second_stop = Command.objects.filter(command_type="container.stop", status=CommandStatus.QUEUED).get()
    assert second_stop.pk != first_stop.pk
    agent_side.error(second_stop, "not_found", "no such container")
    a.refresh_from_db()
    assert a.status == NodeStatus.CORDONED


def test_drain_of_an_empty_node_and_tick_over_all_draining_nodes(owner, trio):
    a, b, _c = trio
    run_container(owner, b, "web")
    b = services.node_drain(node=b, actor=owner)
    assert b.status == NodeStatus.DRAINING
    # Containers that are not running (exited) do not hold a drain up.
    agent_side.inventory(b, containers=[agent_side.running("web", "cid-web-b", status="exited")])
    b.refresh_from_db()
    assert b.status == NodeStatus.CORDONED
    assert drain_tick() == {}
    assert drain.drain_step(node_id=a.pk).status == NodeStatus.ONLINE  # not draining: nothing done


def test_tick_runs_every_draining_node(owner, cluster, register_node):
    a, b, _c = (register_node(cluster, n) for n in "abc")
    run_container(owner, a, "one")
    run_container(owner, b, "two", memory_mb=900000)
    services.node_drain(node=a, actor=owner)
    services.node_drain(node=b, actor=owner)
    assert drain_tick() == {str(a.pk): NodeStatus.DRAINING, str(b.pk): NodeStatus.DRAINING}
    assert Container.objects.filter(replacement_of__node=a).count() == 1
    assert NodeEvent.objects.filter(node=b, kind="drain.no_fit").count() == 1


def test_stop_that_keeps_failing_is_given_up_and_reported(owner, trio):
    a, _b, _c = trio
    web = run_container(owner, a, "web")
    services.node_drain(node=a, actor=owner)
    drain.drain_step(node_id=a.pk)
    agent_side.result(Container.objects.get(replacement_of=web).created_by_command, container_id="r1")
    for _ in range(drain.MAX_STOP_ATTEMPTS):
        stop = Command.objects.get(command_type="container.stop", status=CommandStatus.QUEUED)
        agent_side.error(stop, "internal", "boom")
    assert not Command.objects.filter(command_type="container.stop", status=CommandStatus.QUEUED).exists()
    report = drain.drain_step(node_id=a.pk)
    assert report.blocked[0]["reason"] == f"stopping web failed {drain.MAX_STOP_ATTEMPTS} times"
    a.refresh_from_db()
    assert a.status == NodeStatus.DRAINING


def test_worker_registers_the_drain_tasks_and_beat_runs_the_tick():
    import subprocess
    import sys

    from django.conf import settings

    # A fresh interpreter, as a worker starts: only the app's own task discovery imports modules.
    code = (
        "import django; django.setup(); from cleverthis.celery import app; "
        "app.loader.import_default_modules(); print(sorted(t for t in app.tasks if 'workload' in t))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "fleet.workload_tasks.drain_tick" in out.stdout
    assert "fleet.workload_tasks.drain_node_now" in out.stdout
    schedule = {entry["task"]: entry["schedule"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert schedule["fleet.workload_tasks.drain_tick"] == 10.0


@pytest.mark.django_db(transaction=True)
def test_a_pass_never_waits_for_another_pass_holding_the_node(owner, trio, monkeypatch):
    import threading

    from django.db import connection, transaction

    from fleet import enqueue

    # Real commits here: keep the on-commit task sends off the broker (no worker runs in tests).
    monkeypatch.setattr(enqueue, "send", lambda *a: None)
    a, _b, _c = trio
    run_container(owner, a, "web")
    services.node_drain(node=a, actor=owner)
    locked, release = threading.Event(), threading.Event()

    def other_pass() -> None:
        try:
            with transaction.atomic():
                list(type(a).objects.select_for_update().filter(pk=a.pk))
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=other_pass)
    thread.start()
    try:
        assert locked.wait(30)
        report = drain.drain_step(node_id=a.pk)
        assert report.status == "busy"
        assert not Container.objects.filter(replacement_of__isnull=False).exists()
    finally:
        release.set()
        thread.join(30)
    assert drain.drain_step(node_id=a.pk).replacing  # once free, the next pass does the work


def test_replacement_that_dies_before_taking_over_is_replaced_again(owner, trio):
    a, b, c = trio
    web = run_container(owner, a, "web", start=False)  # created stopped, started later by hand
    agent_side.inventory(a, containers=[agent_side.running("web", "cid-web-a")])
    services.node_drain(node=a, actor=owner)
    drain.drain_step(node_id=a.pk)
    first = Container.objects.get(replacement_of=web)
    assert first.created_by_command.payload["start"] is True
    # The agent on the target reports it created but not yet running: the drain waits, no second copy.
    target = first.node
    agent_side.inventory(target, containers=[agent_side.running("web-r1", "r1", status="created")])
    assert [w["name"] for w in drain.drain_step(node_id=a.pk).waiting] == ["web"]
    # Then it vanishes: a fresh replacement is started, the original still runs.
    agent_side.inventory(target, containers=[])
    first.refresh_from_db()
    assert first.status == ContainerStatus.MISSING
    second = Container.objects.filter(replacement_of=web).exclude(pk=first.pk).get()
    assert second.name == "web-r2"
    web.refresh_from_db()
    assert web.status == ContainerStatus.RUNNING
    assert {b.pk, c.pk} >= {first.node_id, second.node_id}

"""DockerExecutor against a real engine: Podman's Docker-compatible API started by .ci/podman-setup."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import docker
import pytest

from agent.errors import CommandFailed
from agent.executors.docker import COMMAND_KEY_LABEL, MANAGED_LABEL, DockerExecutor, split_image
from agent.protocol import ContainerCreatePayload, ContainerRefPayload, PortMapping
from agent.runner import CommandRunner
from agent.workloads.endpoints import EndpointManager
from agent.workloads.models import ModelCache
from tests.agent.executors.podman import TEST_IMAGE, VOLUME_IMAGE, registry_address, require_podman
from tests.agent.executors.registry import RegistryStandin
from tests.support.unix_relay import UnixRelay

RUN_LABEL = "io.cleverthis.test-run"


class Recorder:
    """A ProgressFn that keeps every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float | None, dict]] = []

    def __call__(self, message: str, percent: float | None = None, data: dict | None = None) -> None:
        self.calls.append((message, percent, data or {}))


@pytest.fixture
def run_id() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
def engine(run_id: str) -> Iterator[docker.DockerClient]:
    """A raw docker client on the Podman socket; removes this test's containers afterwards."""
    client = docker.DockerClient(base_url=require_podman())
    yield client
    for container in client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"}):
        container.remove(force=True, v=True)
    client.close()


@pytest.fixture
def executor(engine: docker.DockerClient) -> DockerExecutor:
    return DockerExecutor(base_url=require_podman())


def payload(run_id: str, **overrides: object) -> ContainerCreatePayload:
    values: dict = {
        "image": TEST_IMAGE,
        "name": f"ct-{run_id}-{uuid.uuid4().hex[:4]}",
        "command": ["sleep", "300"],
        "labels": {RUN_LABEL: run_id},
    }
    values.update(overrides)
    return ContainerCreatePayload(**values)


def test_create_runs_the_container_with_requests_and_our_labels(executor, engine, run_id):
    spec = payload(
        run_id,
        env={"GREETING": "hello"},
        ports=[PortMapping(container_port=8080)],
        cpu=0.5,
        memory_mb=64,
    )
    result = executor.execute("container.create", spec, command_key=f"key-{run_id}", progress=Recorder())

    assert result.status == "running"
    assert result.ports["8080"] > 0
    raw = engine.containers.get(result.container_id)
    assert raw.name == spec.name
    assert raw.labels[MANAGED_LABEL] == "true"
    assert raw.labels[COMMAND_KEY_LABEL] == f"key-{run_id}"
    assert "GREETING=hello" in raw.attrs["Config"]["Env"]
    assert raw.attrs["HostConfig"]["NanoCpus"] == 500_000_000
    assert raw.attrs["HostConfig"]["Memory"] == 64 * 1024 * 1024
    assert raw.attrs["Config"]["Cmd"] == ["sleep", "300"]


def test_create_is_idempotent_on_the_command_key(executor, engine, run_id):
    first = executor.execute("container.create", payload(run_id), command_key=f"k-{run_id}", progress=Recorder())
    again = executor.execute(
        "container.create", payload(run_id), command_key=f"k-{run_id}", progress=Recorder()
    )  # a different name: the key alone decides
    assert again.container_id == first.container_id
    assert again.existed is True
    assert first.existed is False
    assert len(engine.containers.list(all=True, filters={"label": f"{COMMAND_KEY_LABEL}=k-{run_id}"})) == 1


def test_create_without_start_leaves_it_created(executor, run_id):
    result = executor.execute(
        "container.create", payload(run_id, start=False), command_key=f"ns-{run_id}", progress=Recorder()
    )
    assert result.status == "created"


def test_stop_start_destroy_lifecycle(executor, engine, run_id):
    created = executor.execute("container.create", payload(run_id), command_key=f"l-{run_id}", progress=Recorder())
    ref = ContainerRefPayload(container=created.container_id, timeout_s=1)  # busybox PID 1 ignores SIGTERM

    assert executor.execute("container.stop", ref, command_key="s", progress=Recorder()).status == "exited"
    assert engine.containers.get(created.container_id).status == "exited"
    by_name = ContainerRefPayload(container=created.name, timeout_s=1)
    assert executor.execute("container.start", by_name, command_key="st", progress=Recorder()).status == "running"

    assert executor.execute("container.destroy", ref, command_key="d", progress=Recorder()).status == "missing"
    with pytest.raises(docker.errors.NotFound):
        engine.containers.get(created.container_id)
    # Destroying again is harmless; stopping a missing container is a documented failure.
    assert executor.execute("container.destroy", ref, command_key="d2", progress=Recorder()).status == "missing"
    with pytest.raises(CommandFailed) as err:
        executor.execute("container.stop", ref, command_key="s2", progress=Recorder())
    assert err.value.code == "not_found"


def test_list_containers_reports_only_ours(executor, engine, run_id):
    ours = executor.execute("container.create", payload(run_id), command_key=f"o-{run_id}", progress=Recorder())
    foreign = engine.containers.create(TEST_IMAGE, ["sleep", "300"], labels={RUN_LABEL: run_id})

    listed = {c.container_id: c for c in executor.list_containers()}
    assert ours.container_id in listed
    assert foreign.id not in listed
    info = listed[ours.container_id]
    assert info.command_key == f"o-{run_id}"
    assert info.status == "running"
    assert info.image.endswith("busybox:test")

    with pytest.raises(CommandFailed) as err:
        executor.execute(
            "container.destroy", ContainerRefPayload(container=foreign.id), command_key="x", progress=Recorder()
        )
    assert err.value.code == "not_found"
    assert engine.containers.get(foreign.id).id == foreign.id


def test_name_taken_by_another_container_is_a_conflict(executor, engine, run_id):
    spec = payload(run_id)
    engine.containers.create(TEST_IMAGE, ["sleep", "1"], name=spec.name, labels={RUN_LABEL: run_id})
    with pytest.raises(CommandFailed) as err:
        executor.execute("container.create", spec, command_key=f"c-{run_id}", progress=Recorder())
    assert err.value.code == "conflict"


def test_pull_failure_from_an_unreachable_registry(executor, run_id):
    progress = Recorder()
    with pytest.raises(CommandFailed) as err:
        executor.execute(
            "container.create",
            payload(run_id, image="127.0.0.1:1/nope:latest"),
            command_key=f"p-{run_id}",
            progress=progress,
        )
    assert err.value.code == "image_pull_failed"
    assert "127.0.0.1:1" in err.value.message
    assert any("pulling image" in message for message, _, _ in progress.calls)


def test_destroy_removes_the_anonymous_volumes(executor, engine, run_id):
    created = executor.execute(
        "container.create", payload(run_id, image=VOLUME_IMAGE), command_key=f"v-{run_id}", progress=Recorder()
    )
    [mount] = engine.containers.get(created.container_id).attrs["Mounts"]
    assert mount["Destination"] == "/data"
    assert engine.volumes.get(mount["Name"])

    executor.execute(
        "container.destroy",
        ContainerRefPayload(container=created.container_id, timeout_s=1),
        command_key="d",
        progress=Recorder(),
    )
    with pytest.raises(docker.errors.NotFound):
        engine.volumes.get(mount["Name"])


@pytest.fixture
def registry(engine: docker.DockerClient) -> Iterator[tuple[str, RegistryStandin]]:
    """A registry stand-in on the insecure test address serving the busybox image (no auth)."""
    port = registry_address().rsplit(":", 1)[1]
    saved = b"".join(engine.images.get(TEST_IMAGE).save())
    try:
        standin = RegistryStandin(saved, int(port)).start()
    except OSError as exc:  # not a skip: with Podman present these tests must run
        pytest.fail(f"cannot listen on the test registry address {registry_address()}: {exc}")
    yield registry_address(), standin
    standin.stop()
    for image in engine.images.list():
        for tag in image.tags:
            if tag.startswith(registry_address()):  # untag only: the image is shared with TEST_IMAGE
                engine.images.remove(tag)


def test_missing_image_is_pulled_with_progress(executor, registry, run_id):
    address, standin = registry
    image = f"{address}/team/busybox:{run_id}"
    progress = Recorder()
    result = executor.execute(
        "container.create", payload(run_id, image=image), command_key=f"pull-{run_id}", progress=progress
    )
    assert result.status == "running"
    messages = [m for m, _, _ in progress.calls]
    assert messages[0] == f"pulling image {image}"
    assert f"pulled image {image}" in messages
    assert any("/blobs/" in r for r in standin.requests)

    served = len(standin.requests)
    again = executor.execute(  # present now: no second pull
        "container.create", payload(run_id, image=image), command_key=f"pull2-{run_id}", progress=Recorder()
    )
    assert again.status == "running"
    assert len(standin.requests) == served


def test_private_registry_needs_credentials(executor, registry, run_id):
    address, standin = registry
    standin.credentials = ("robot", "s3cret")
    image = f"{address}/private/busybox:{run_id}"
    with pytest.raises(CommandFailed) as err:
        executor.execute(
            "container.create", payload(run_id, image=image), command_key=f"a-{run_id}", progress=Recorder()
        )
    assert err.value.code == "registry_auth_failed"

    with_creds = payload(run_id, image=image, registry_username="robot", registry_password="s3cret")
    assert (
        executor.execute("container.create", with_creds, command_key=f"b-{run_id}", progress=Recorder()).status
        == "running"
    )


def _runner(executor: DockerExecutor, tmp_path) -> CommandRunner:
    models = ModelCache(tmp_path / "models")
    return CommandRunner(
        executor=executor,
        models=models,
        endpoints=EndpointManager(models, tmp_path / "endpoints"),
        journal_path=tmp_path / "journal.jsonl",
    )


def test_a_container_removed_between_listing_and_inspecting_fails_no_inventory(executor, engine, run_id, tmp_path):
    """The engine changes underneath the inventory: a container goes away right after the listing.

    The removal is real (Podman removes it); the hook only times it, between the engine's list answer
    and whatever the inventory does next (the SDK's `containers.list` inspected each one and raised
    `NotFound`, which killed the agent's heartbeat task).
    """
    created = [
        executor.execute("container.create", payload(run_id), command_key=f"r{i}-{run_id}", progress=Recorder())
        for i in range(3)
    ]
    client = executor._docker()
    real_list = client.api.containers
    to_remove = [created[1].container_id, created[0].container_id]

    def list_then_remove_one(*args, **kwargs):
        rows = real_list(*args, **kwargs)
        if to_remove:
            engine.containers.get(to_remove.pop(0)).remove(force=True, v=True)
        return rows

    client.api.containers = list_then_remove_one
    listed = {c.container_id for c in executor.list_containers()}
    assert {c.container_id for c in created} <= listed  # as listed: the next listing drops it

    runner = _runner(executor, tmp_path)
    inventory = runner.inventory([])  # never raises
    assert {created[0].container_id, created[2].container_id} <= {c.container_id for c in inventory.containers}
    current = {c.container_id for c in runner.inventory([]).containers}
    assert current & {c.container_id for c in created} == {created[2].container_id}


def test_inventory_through_an_engine_restart_keeps_the_last_listed_containers(engine, run_id, tmp_path, caplog):
    """The engine goes away (its socket closes every connection and refuses new ones) and comes back.

    Meanwhile the inventory still goes out, with the containers as last listed (not reported as gone)
    and the other parts as they are; the failure is logged once, not on every heartbeat.
    """
    relay = UnixRelay(tmp_path / "engine.sock", require_podman().removeprefix("unix://")).up()
    try:
        executor = DockerExecutor(base_url=relay.url)
        made = executor.execute("container.create", payload(run_id), command_key=f"e-{run_id}", progress=Recorder())
        runner = _runner(executor, tmp_path)
        before = runner.inventory([]).containers
        assert made.container_id in {c.container_id for c in before}

        relay.down()
        with caplog.at_level(logging.WARNING, logger="agent.runner"):
            during = [runner.inventory([]) for _ in range(3)]
        assert all(inv.containers == before for inv in during)
        assert len([r for r in caplog.records if "cannot read the containers" in r.getMessage()]) == 1

        engine.containers.get(made.container_id).remove(force=True, v=True)
        relay.up()
        after = runner.inventory([]).containers
        assert made.container_id not in {c.container_id for c in after}
    finally:
        relay.down()


def test_docker_not_running_is_docker_unavailable(tmp_path):
    executor = DockerExecutor(base_url=f"unix://{tmp_path}/no-such.sock")
    with pytest.raises(CommandFailed) as err:
        executor.execute("container.create", payload("x"), command_key="k", progress=Recorder())
    assert err.value.code == "docker_unavailable"
    with pytest.raises(CommandFailed) as err:
        executor.list_containers()
    assert err.value.code == "docker_unavailable"


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("busybox", ("busybox", "latest")),
        ("localhost/busybox:test", ("localhost/busybox", "test")),
        ("127.0.0.1:5000/team/app", ("127.0.0.1:5000/team/app", "latest")),
        ("127.0.0.1:5000/app:v2", ("127.0.0.1:5000/app", "v2")),
        ("ghcr.io/a/b@sha256:abc", ("ghcr.io/a/b", "sha256:abc")),
    ],
)
def test_split_image(image, expected):
    assert split_image(image) == expected

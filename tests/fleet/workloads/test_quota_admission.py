"""Workspace quotas at every fleet admission: container.create (page/API/commands), endpoint create, plain
endpoint.start and restart, drain replacements; the 409's fields; lowering a quota below use."""

from __future__ import annotations

import pytest

from agent import protocol
from fleet import services
from fleet.models import Command
from fleet.workloads import drain
from fleet.workloads import services as workloads
from fleet.workloads.models import Container, ContainerStatus, Endpoint, EndpointStatus
from kernel.exceptions import QuotaExceeded
from tenancy import services as tenancy_services
from tenancy.quotas import usage
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db

LLAMA = protocol.CachedModel(model_id="meta-llama/Llama-3.2-1B", revision="main", path="/cache/llama", size_bytes=5)


def quota_usage(workspace) -> dict[str, float]:
    return usage([workspace.pk])[workspace.pk]


def limit(owner, workspace, **limits) -> None:
    tenancy_services.workspace_quota_set(actor=owner, workspace=workspace, limits=limits)


def create(owner, node, name: str, **spec) -> list[Command]:
    payload = {"image": "nginx:1.27", "name": name, **spec}
    return services.command_dispatch(
        actor=owner, cluster=node.cluster, command_type="container.create", payload=payload, node=node
    )


def test_container_create_is_refused_at_the_containers_quota_and_writes_nothing(owner, workspace, node):
    limit(owner, workspace, containers=2)
    create(owner, node, "a")
    create(owner, node, "b")
    assert Container.objects.filter(status=ContainerStatus.PENDING).count() == 2  # counted from queueing on
    with pytest.raises(QuotaExceeded) as refused:
        create(owner, node, "c")
    assert (refused.value.quota, refused.value.limit, refused.value.in_use, refused.value.asked) == (
        "containers",
        2,
        2,
        1,
    )
    assert "Containers is limited to 2" in str(refused.value)
    assert Command.objects.filter(command_type="container.create").count() == 2
    assert Container.objects.count() == 2


@pytest.mark.parametrize(
    ("quota", "value", "spec", "in_use", "asked"),
    [
        ("cpu_cores", 3, {"cpu": 1.5}, 3.0, 1.5),
        ("memory_gib", 2, {"memory_mb": 1024}, 2.0, 1.0),
        ("gpus", 2, {"gpus": 1}, 2, 1),
    ],
)
def test_container_resources_count_what_the_payload_requests(owner, workspace, node, quota, value, spec, in_use, asked):
    limit(owner, workspace, **{quota: value})
    create(owner, node, "a", **spec)
    create(owner, node, "b", **spec)
    with pytest.raises(QuotaExceeded) as refused:
        create(owner, node, "c", **spec)
    assert (refused.value.quota, refused.value.in_use, refused.value.asked) == (quota, in_use, asked)


def test_a_fan_out_asks_for_one_container_per_node(owner, workspace, cluster, register_node):
    register_node(cluster, "a")
    register_node(cluster, "b")
    limit(owner, workspace, containers=1)
    with pytest.raises(QuotaExceeded) as refused:
        services.command_dispatch(
            actor=owner, cluster=cluster, command_type="container.create", payload={"image": "x", "name": "w"}
        )
    assert refused.value.asked == 2
    assert not Command.objects.exists()


def test_finished_and_failed_containers_free_their_quota(owner, workspace, node):
    limit(owner, workspace, containers=1)
    (command,) = create(owner, node, "a")
    agent_side.result(command, container_id="cid-a")
    with pytest.raises(QuotaExceeded):
        create(owner, node, "b")
    row = Container.objects.get(created_by_command=command)
    assert row.status == ContainerStatus.RUNNING  # the row queued is the row the result fills in
    services.command_dispatch(
        actor=owner, cluster=node.cluster, command_type="container.destroy", payload={"container": "a"}, node=node
    )
    agent_side.result(Command.objects.get(command_type="container.destroy"))
    (again,) = create(owner, node, "b")
    services.command_record_error(node=node, command_id=again.pk, code="internal", message="no")
    assert Container.objects.get(created_by_command=again).status == ContainerStatus.FAILED
    create(owner, node, "c")  # the failed one holds nothing


def ref_command(owner, node, command_type: str, name: str) -> Command:
    (command,) = services.command_dispatch(
        actor=owner, cluster=node.cluster, command_type=command_type, payload={"container": name}, node=node
    )
    return command


def test_starting_a_stopped_container_is_admitted_again(owner, workspace, node):
    limit(owner, workspace, containers=1, memory_gib=1)
    (command,) = create(owner, node, "a", memory_mb=1024)
    agent_side.result(command, container_id="cid-a")
    agent_side.result(ref_command(owner, node, "container.stop", "a"))
    a = Container.objects.get(name="a")
    assert a.status == ContainerStatus.STOPPED  # holds no quota now
    (b,) = create(owner, node, "b", memory_mb=1024)
    with pytest.raises(QuotaExceeded) as refused:
        ref_command(owner, node, "container.start", "a")
    assert (refused.value.quota, refused.value.in_use, refused.value.asked) == ("memory_gib", 1.0, 1.0)
    assert not Command.objects.filter(command_type="container.start").exists()
    services.command_record_error(node=node, command_id=b.pk, code="internal", message="no")  # b frees its place
    start = ref_command(owner, node, "container.start", "a")
    a.refresh_from_db()
    assert a.status == ContainerStatus.PENDING  # counted from queueing on
    with pytest.raises(QuotaExceeded):
        create(owner, node, "c")
    services.command_record_error(node=node, command_id=start.pk, code="internal", message="no")
    a.refresh_from_db()
    assert a.status == ContainerStatus.EXITED  # a start that failed frees the quota again
    again = ref_command(owner, node, "container.start", "a")
    agent_side.result(again, container_id="cid-a")
    a.refresh_from_db()
    assert a.status == ContainerStatus.RUNNING
    agent_side.result(ref_command(owner, node, "container.start", "a"), container_id="cid-a")  # running: no ask


def test_api_refusal_is_a_409_naming_quota_limit_in_use_and_asked(owner, workspace, node, api_client_for):
    limit(owner, workspace, gpus=1)
    api = api_client_for(owner)
    body = {
        "command_type": "container.create",
        "payload": {"image": "x", "name": "w", "gpus": 2},
        "node_id": str(node.pk),
    }
    response = api.post(f"/api/v1/clusters/{node.cluster_id}/commands", body, format="json")
    assert response.status_code == 409, response.content
    answer = response.json()
    assert {k: answer[k] for k in ("quota", "limit", "in_use", "asked")} == {
        "quota": "gpus",
        "limit": 1,
        "in_use": 0,
        "asked": 2,
    }
    assert "GPUs is limited to 1" in answer["detail"]


def test_commands_page_shows_the_refusal(client, owner, workspace, node):
    limit(owner, workspace, containers=0)
    client.force_login(owner)
    response = client.post(
        f"/compute/clusters/{node.cluster_id}/commands/",
        {"command_type": "container.create", "target": "all", "p-image": "nginx", "p-name": "web"},
    )
    assert response.status_code == 409
    assert "Quota exceeded: Containers is limited to 0" in response.content.decode()


def test_lowering_a_quota_below_use_refuses_new_work_and_stops_nothing(owner, workspace, node):
    (a,) = create(owner, node, "a")
    (b,) = create(owner, node, "b")
    agent_side.result(a, container_id="cid-a")
    limit(owner, workspace, containers=1)
    assert Container.objects.filter(status__in=ContainerStatus.active()).count() == 2
    assert not Command.objects.filter(command_type__in=["container.stop", "container.destroy"]).exists()
    with pytest.raises(QuotaExceeded) as refused:
        create(owner, node, "c")
    assert (refused.value.limit, refused.value.in_use) == (1, 2)
    agent_side.result(b, container_id="cid-b")  # work admitted before keeps going
    assert Container.objects.get(created_by_command=b).status == ContainerStatus.RUNNING


def test_owner_sets_quotas_and_reads_usage_back_in_the_api(api_client_for, owner, workspace, cluster, node):
    services.command_dispatch(
        actor=owner,
        cluster=cluster,
        command_type="container.create",
        payload={"image": "x", "name": "w", "cpu": 1.5, "memory_mb": 512},
        node=node,
    )
    api = api_client_for(owner)
    response = api.patch(
        f"/api/v1/workspaces/{workspace.pk}/quotas/", {"containers": 5, "cpu_cores": 2.5, "gpus": None}, format="json"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["can_edit"] is True
    assert _line(body, "containers") == {
        "quota": "containers",
        "label": "Containers",
        "unit": "",
        "limit": 5,
        "in_use": 1,
        "percent": 20,
    }
    assert (_line(body, "cpu_cores")["limit"], _line(body, "cpu_cores")["in_use"]) == (2.5, 1.5)
    assert (_line(body, "memory_gib")["limit"], _line(body, "memory_gib")["in_use"]) == (None, 0.5)
    assert api.get(f"/api/v1/workspaces/{workspace.pk}/quotas/").json() == body


def _line(body, name) -> dict:
    return next(q for q in body["quotas"] if q["quota"] == name)


# ---- endpoints


def test_endpoint_create_is_refused_at_the_endpoints_quota(owner, workspace, node):
    agent_side.inventory(node, models=[LLAMA])
    limit(owner, workspace, endpoints=1)
    workloads.endpoint_create(actor=owner, cluster=node.cluster, model_id=LLAMA.model_id)
    with pytest.raises(QuotaExceeded) as refused:
        workloads.endpoint_create(actor=owner, cluster=node.cluster, model_id=LLAMA.model_id)
    assert refused.value.quota == "endpoints"
    assert Endpoint.objects.count() == 1


# The test nodes hold one 80,000 MB GPU: vLLM takes 0.9 of it by default (72,000 MB = 70.3125 GiB).
HELD_GIB = 80_000 * 0.9 / 1024


def cpu_node(cluster, hostname: str = "cpu-box-1"):
    """A node without GPUs, registered and connected through the real services."""
    from tests.fleet.conftest import facts_dict, make_csr_pem, make_key

    _, raw = services.join_token_create(cluster=cluster, actor=cluster.workspace.memberships.get().user)
    facts = facts_dict(hostname, gpus=[])
    node, _ = services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts)
    services.node_connected(
        node=node, facts=protocol.from_dict(protocol.HostFacts, facts, where="facts"), inventory=protocol.Inventory()
    )
    node.refresh_from_db()
    return node


def test_an_endpoint_on_a_gpu_node_counts_the_gpu_it_holds_though_it_asked_none(owner, workspace, node):
    """The agent pins at least one GPU on a GPU node (`agent.protocol.endpoint_gpus_held`): so does the quota."""
    agent_side.inventory(node, models=[LLAMA])
    limit(owner, workspace, gpus=1)
    first = workloads.endpoint_create(actor=owner, cluster=node.cluster, model_id=LLAMA.model_id)  # gpus=0 asked
    assert first.gpus == 0
    assert quota_usage(workspace)["gpus"] == 1
    with pytest.raises(QuotaExceeded) as refused:
        workloads.endpoint_create(actor=owner, cluster=node.cluster, model_id=LLAMA.model_id)
    assert (refused.value.quota, refused.value.in_use, refused.value.asked) == ("gpus", 1, 1)
    assert Endpoint.objects.count() == 1
    # the raw endpoint.start of the Commands tab / API is held to the same rule
    with pytest.raises(QuotaExceeded):
        services.command_dispatch(
            actor=owner,
            cluster=node.cluster,
            command_type="endpoint.start",
            payload={"model_id": LLAMA.model_id},
            node=node,
        )
    assert Endpoint.objects.count() == 1


def test_an_endpoint_counts_the_vram_vllm_takes_on_its_gpus_never_less_than_asked(owner, workspace, node):
    agent_side.inventory(node, models=[LLAMA])
    limit(owner, workspace, vram_gib=100)
    workloads.endpoint_create(actor=owner, cluster=node.cluster, model_id=LLAMA.model_id, min_vram_mb=4096)
    assert quota_usage(workspace)["vram_gib"] == pytest.approx(HELD_GIB)
    with pytest.raises(QuotaExceeded) as refused:
        workloads.endpoint_create(actor=owner, cluster=node.cluster, model_id=LLAMA.model_id)
    assert refused.value.quota == "vram_gib"
    assert (refused.value.in_use, refused.value.asked) == (round(HELD_GIB, 2), round(HELD_GIB, 2))
    # a smaller share of the GPU (--gpu-memory-utilization) holds less: it fits beside the first
    workloads.endpoint_create(
        actor=owner, cluster=node.cluster, model_id=LLAMA.model_id, server_args=["--gpu-memory-utilization", "0.3"]
    )
    assert quota_usage(workspace)["vram_gib"] == pytest.approx(HELD_GIB + 80_000 * 0.3 / 1024)


def test_an_endpoint_on_a_cpu_node_holds_no_gpu(owner, workspace, cluster):
    node = cpu_node(cluster)
    agent_side.inventory(node, models=[LLAMA])
    limit(owner, workspace, gpus=0, vram_gib=0)
    workloads.endpoint_create(actor=owner, cluster=cluster, model_id=LLAMA.model_id)
    assert quota_usage(workspace)["gpus"] == 0
    assert quota_usage(workspace)["vram_gib"] == 0


def test_each_endpoint_replica_counts_its_vram_and_a_refused_replica_leaves_nothing(
    owner, workspace, cluster, register_node
):
    nodes = [register_node(cluster, name) for name in ("a", "b")]
    for node in nodes:
        agent_side.inventory(node, models=[LLAMA])
    limit(owner, workspace, vram_gib=100)
    with pytest.raises(QuotaExceeded) as refused:
        workloads.endpoint_create(
            actor=owner, cluster=cluster, model_id=LLAMA.model_id, min_vram_mb=4096, min_replicas=2
        )
    assert refused.value.quota == "vram_gib"
    assert (refused.value.in_use, refused.value.asked) == (round(HELD_GIB, 2), round(HELD_GIB, 2))  # the 2nd
    assert not Endpoint.objects.exists()
    assert not Command.objects.exists()
    limit(owner, workspace, vram_gib=141)
    endpoint = workloads.endpoint_create(
        actor=owner, cluster=cluster, model_id=LLAMA.model_id, min_vram_mb=4096, min_replicas=2
    )
    assert endpoint.replicas.count() == 2
    assert quota_usage(workspace)["vram_gib"] == pytest.approx(2 * HELD_GIB)


def test_plain_endpoint_start_is_admitted_too(owner, workspace, node):
    agent_side.inventory(node, models=[LLAMA])
    limit(owner, workspace, endpoints=1)
    start = {"model_id": LLAMA.model_id}
    services.command_dispatch(
        actor=owner, cluster=node.cluster, command_type="endpoint.start", payload=start, node=node
    )
    with pytest.raises(QuotaExceeded):
        services.command_dispatch(
            actor=owner, cluster=node.cluster, command_type="endpoint.start", payload=start, node=node
        )
    assert Endpoint.objects.count() == 1
    assert Command.objects.filter(command_type="endpoint.start").count() == 1


def test_restarting_a_stopped_endpoint_is_admitted_and_a_live_one_counts_once(owner, workspace, node):
    agent_side.inventory(node, models=[LLAMA])
    limit(owner, workspace, endpoints=1)
    first = workloads.endpoint_create(actor=owner, cluster=node.cluster, model_id=LLAMA.model_id)
    agent_side.result(first.start_command, port=8001)
    # sending the live endpoint's start again asks nothing more
    services.command_dispatch(
        actor=owner,
        cluster=node.cluster,
        command_type="endpoint.start",
        payload={"endpoint_id": first.slug, "model_id": LLAMA.model_id},
        node=node,
    )
    first = workloads.endpoint_stop(actor=owner, endpoint=Endpoint.objects.get(pk=first.pk))
    agent_side.result(Command.objects.get(pk=first.stop_command_id))
    second = workloads.endpoint_create(actor=owner, cluster=node.cluster, model_id=LLAMA.model_id)
    with pytest.raises(QuotaExceeded):
        workloads.endpoint_restart(actor=owner, endpoint=Endpoint.objects.get(pk=first.pk))
    assert Endpoint.objects.get(pk=first.pk).status == EndpointStatus.STOPPED
    assert Endpoint.objects.get(pk=second.pk).status == EndpointStatus.PENDING


# ---- drain replacements


def test_drain_replacement_waits_for_quota_and_keeps_the_original(owner, workspace, cluster, register_node):
    a, _b = register_node(cluster, "a"), register_node(cluster, "b")
    (command,) = create(owner, a, "web", cpu=2)
    agent_side.result(command, container_id="cid-web")
    limit(owner, workspace, cpu_cores=3)  # the replacement would hold 2 more cores while the original runs
    services.node_drain(node=a, actor=owner)
    report = drain.drain_step(node_id=a.pk)
    assert not report.replacing
    assert len(report.blocked) == 1
    assert "Quota exceeded: CPU cores is limited to 3" in report.blocked[0]["reason"]
    web = Container.objects.get(created_by_command=command)
    assert web.status == ContainerStatus.RUNNING
    assert Container.objects.count() == 1
    limit(owner, workspace, cpu_cores=4)
    assert [r["name"] for r in drain.drain_step(node_id=a.pk).replacing] == ["web"]
    assert Container.objects.get(replacement_of=web).status == ContainerStatus.PENDING

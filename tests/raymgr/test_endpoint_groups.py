"""Distributed endpoints on a managed Ray cluster: checked and admitted as one unit before anything starts, one
`endpoint.start` per rank (leader on the head's node), failing, moving and healing as one unit, stopped as one;
the proxy reaches the leader only; the Ray autoscaler keeps the workers a rank uses."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from agent import protocol
from fleet.models import Command, Node, NodeStatus
from fleet.proxy import endpoint_routes
from fleet.services.command_delivery import command_pending_for_node
from fleet.workloads import services as workloads
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.tasks import endpoints_heal_tick
from kernel.exceptions import IllegalTransition, QuotaExceeded
from raymgr import autoscaler, services
from raymgr.models import RayClusterStatus, RayNode, RayNodeRole, RayNodeStatus
from tenancy import services as tenancy_services
from tenancy.quotas import usage
from tests.fleet import agent_side
from tests.raymgr.conftest import finish, last_command, start_head

pytestmark = pytest.mark.django_db

LLAMA = protocol.CachedModel(model_id="meta-llama/Llama-3.2-1B", revision="main", path="/cache/llama", size_bytes=5)


@pytest.fixture
def ray(compute, add_node, make_ray):
    """A running Ray cluster of a head and one worker on two CPU nodes holding the model."""
    for name in ("cpu-1", "cpu-2"):
        agent_side.inventory(add_node(compute, name, memory_mb=32000), models=[LLAMA])
    cluster = make_ray(min_workers=1, max_workers=1)
    start_head(cluster, ip="10.0.0.1")
    worker = RayNode.objects.get(ray_cluster=cluster, role=RayNodeRole.WORKER)
    finish(
        last_command("ray.worker.start", cluster_id=str(cluster.pk)),
        data={"container_id": "c-w", "ray_node_id": "cc" * 28},
    )
    worker.refresh_from_db()
    assert worker.status == RayNodeStatus.RUNNING
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.RUNNING
    return cluster


def create(owner, ray, **kwargs):
    kwargs.setdefault("pipeline_parallel", 2)
    return workloads.endpoint_create(
        actor=owner, cluster=ray.compute_cluster, model_id=LLAMA.model_id, ray_cluster=ray, **kwargs
    )


def ranks(endpoint) -> list[EndpointReplica]:
    """The group's current ranks (not those left behind stopping on another node)."""
    rows = endpoint.replicas.select_related("node", "start_command", "stop_command")
    return list(rows.filter(replacements__isnull=True).order_by("group_rank"))


def run(endpoint) -> Endpoint:
    for rank in ranks(endpoint):
        agent_side.result(rank.start_command, port=8001 if rank.group_rank == 0 else 0)
    endpoint.refresh_from_db()
    return endpoint


def test_each_rank_gets_its_start_with_its_group_the_leader_on_the_heads_node(owner, ray):
    endpoint = create(owner, ray)
    head = RayNode.objects.get(ray_cluster=ray, role=RayNodeRole.HEAD)
    worker = RayNode.objects.get(ray_cluster=ray, role=RayNodeRole.WORKER)
    leader, follower = ranks(endpoint)
    assert (leader.group_rank, leader.node_id, leader.ray_node, leader.server_id) == (
        0,
        head.node_id,
        str(head.pk),
        endpoint.slug,  # the proxy finds the endpoint's first server by its slug, as always
    )
    assert (follower.group_rank, follower.node_id, follower.ray_node) == (1, worker.node_id, str(worker.pk))
    groups = [r.start_command.payload["group"] for r in (leader, follower)]
    common = {"pipeline_parallel": 2, "tensor_parallel": 1, "nnodes": 2, "master_addr": "10.0.0.1"}
    assert all(g.items() >= common.items() for g in groups)
    assert groups[0]["master_port"] == groups[1]["master_port"] == endpoint.master_port == 29500
    assert [(g["node_rank"], g["role"], g["backend"]) for g in groups] == [(0, "leader", "mp"), (1, "follower", "mp")]
    assert all("container" not in g for g in groups)  # not serving vLLM: the ranks run beside the Ray containers
    assert endpoint.status == EndpointStatus.PENDING
    messages = list(endpoint.events.filter(kind="endpoint.starting").values_list("message", flat=True))
    assert any("rank 1 (follower) placed on node" in m for m in messages)
    # a second group led from the same node takes the next port
    assert create(owner, ray).master_port == 29501


def test_a_cluster_serving_vllm_names_each_ranks_ray_container(owner, ray):
    ray.serves_vllm = True  # as created with serves_vllm (tests/raymgr/test_serves_vllm.py)
    ray.save(update_fields=["serves_vllm"])
    endpoint = create(owner, ray)
    for rank in ranks(endpoint):
        assert rank.start_command.payload["group"]["container"] == f"ray-{rank.ray_node}"


def test_the_installation_switch_is_the_fallback_for_every_docker_cluster(owner, ray, settings):
    settings.ENDPOINT_GROUP_IN_RAY_CONTAINER = True
    endpoint = create(owner, ray)
    for rank in ranks(endpoint):
        assert rank.start_command.payload["group"]["container"] == f"ray-{rank.ray_node}"


def test_running_only_once_every_rank_runs_and_the_proxy_reaches_the_leader_only(owner, ray):
    endpoint = create(owner, ray)
    leader, follower = ranks(endpoint)
    agent_side.result(follower.start_command, port=0)  # a follower serves no HTTP: no port, still running
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.STARTING
    agent_side.result(leader.start_command, port=8001)
    endpoint.refresh_from_db()
    assert (endpoint.status, endpoint.node_id, endpoint.port) == (EndpointStatus.RUNNING, leader.node_id, 8001)
    endpoint_routes.forget_routes()
    route = endpoint_routes._load_route(endpoint.slug)
    assert [(u.key, u.port) for u in route.replicas] == [(leader.server_id, 8001)]


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"pipeline_parallel": 3}, "pipeline_parallel", "Must equal the Ray cluster's nodes"),
        ({"tensor_parallel": 2}, "tensor_parallel", "has no GPU"),
        ({"pipeline_parallel": 1}, "pipeline_parallel", "at least 2 pipeline stages"),
        ({"min_replicas": 2}, "min_replicas", "one group"),
        ({"target_in_flight": 4}, "target_requests_per_min", "not autoscaled"),
        ({"pipeline_parallel": 0}, "pipeline_parallel", "between 1 and"),
    ],
)
def test_what_a_group_cannot_ask_is_refused_on_its_field_and_nothing_is_written(owner, ray, change, field, words):
    with pytest.raises(ValidationError) as refused:
        create(owner, ray, **change)
    assert words in " ".join(refused.value.message_dict[field])
    assert not Endpoint.objects.exists()
    assert not Command.objects.filter(command_type="endpoint.start").exists()


def test_a_cluster_not_running_or_of_another_workspace_is_refused(owner, ray, make_ray, add_node):
    services.ray_cluster_stop(actor=owner, cluster=ray)
    ray.refresh_from_db()
    with pytest.raises(ValidationError) as refused:
        create(owner, ray)
    assert "a distributed endpoint needs it running" in refused.value.message_dict["ray_cluster"][0]
    with pytest.raises(ValidationError) as alone:
        workloads.endpoint_create(
            actor=owner, cluster=ray.compute_cluster, model_id=LLAMA.model_id, pipeline_parallel=2
        )
    assert "Only an endpoint on a Ray cluster" in alone.value.message_dict["pipeline_parallel"][0]
    assert not Endpoint.objects.exists()


def test_weights_missing_on_one_rank_node_refuses_the_whole_group(owner, ray):
    worker = RayNode.objects.get(ray_cluster=ray, role=RayNodeRole.WORKER)
    agent_side.inventory(worker.node, models=[])  # the worker's node lost the model
    with pytest.raises(IllegalTransition) as refused:
        create(owner, ray)
    assert "cpu-" in str(refused.value)
    assert "not in node" in str(refused.value)
    assert not Endpoint.objects.exists()
    assert not Command.objects.filter(command_type="endpoint.start").exists()


@pytest.fixture
def gpu_ray(compute, add_node, make_ray):
    """A running docker Ray cluster (the default runtime: each Ray node holds its node's GPUs and VRAM) of a head
    and one worker on two nodes of 2 GPUs each holding the model."""
    for name in ("gpu-1", "gpu-2"):
        agent_side.inventory(add_node(compute, name, gpus=2, memory_mb=128000), models=[LLAMA])
    cluster = make_ray(min_workers=1, max_workers=1)
    start_head(cluster, ip="10.0.0.7")
    finish(
        last_command("ray.worker.start", cluster_id=str(cluster.pk)),
        data={"container_id": "c-w", "ray_node_id": "cc" * 28},
    )
    cluster.refresh_from_db()
    assert cluster.status == RayClusterStatus.RUNNING
    return cluster


def _quota_lines(api, workspace) -> dict[str, float]:
    body = api.get(f"/api/v1/workspaces/{workspace.pk}/quotas/").json()
    return {q["quota"]: q["in_use"] for q in body["quotas"]}


def test_a_quota_exactly_covering_the_ray_cluster_starts_a_group_on_its_gpus(owner, workspace, gpu_ray, api, client):
    ray_nodes = list(RayNode.objects.filter(ray_cluster=gpu_ray))
    assert [n.req_gpus for n in ray_nodes] == [2, 2]  # the Ray nodes hold (and count) their nodes' GPUs
    held_by_ray = usage([workspace.pk])[workspace.pk]
    assert held_by_ray["gpus"] == 4
    tenancy_services.workspace_quota_set(
        actor=owner, workspace=workspace, limits={"gpus": 4, "vram_gib": held_by_ray["vram_gib"]}
    )
    endpoint = create(owner, gpu_ray, tensor_parallel=2)  # QuotaExceeded when the ranks counted their GPUs again
    leader, follower = ranks(endpoint)
    assert [r.start_command.payload["gpus"] for r in (leader, follower)] == [2, 2]
    assert [(r.held_gpus, r.covered_gpus) for r in (leader, follower)] == [(2, 2), (2, 2)]
    assert all(0 < r.covered_vram_mb == r.held_vram_mb for r in (leader, follower))
    after = usage([workspace.pk])[workspace.pk]
    assert (after["gpus"], after["vram_gib"]) == (4, held_by_ray["vram_gib"])  # not double
    # the workspace's quota page and API show the same: the Ray nodes' GPUs once
    shown = _quota_lines(api, workspace)
    assert (shown["gpus"], shown["vram_gib"]) == (4, round(held_by_ray["vram_gib"], 2))
    client.force_login(owner)
    page = client.get(f"/workspaces/{workspace.pk}/quotas/").content.decode()
    row = page[page.index('data-quota="gpus"') :]
    assert row[: row.index("</tr>")].count("<td>4</td>") == 1


def test_a_rank_asking_more_than_its_ray_node_holds_is_charged_the_excess_all_or_none(owner, workspace, gpu_ray):
    first = create(owner, gpu_ray)  # tensor_parallel 1: 1 GPU of each Ray node's 2, charged nothing
    assert [(r.held_gpus, r.covered_gpus) for r in ranks(first)] == [(1, 1), (1, 1)]
    in_use = usage([workspace.pk])[workspace.pk]
    assert in_use["gpus"] == 4
    # a second group of 2 GPUs per rank: its Ray node's GPUs left uncovered are 1 per node, the rest is charged
    tenancy_services.workspace_quota_set(actor=owner, workspace=workspace, limits={"gpus": 5})
    with pytest.raises(QuotaExceeded):  # room for one rank's excess, not for the group's two
        create(owner, gpu_ray, tensor_parallel=2)
    assert Endpoint.objects.count() == 1
    assert Command.objects.filter(command_type="endpoint.start").count() == 2
    tenancy_services.workspace_quota_set(actor=owner, workspace=workspace, limits={"gpus": 6})
    second = create(owner, gpu_ray, tensor_parallel=2)
    assert [(r.held_gpus, r.covered_gpus) for r in ranks(second)] == [(2, 1), (2, 1)]
    after = usage([workspace.pk])[workspace.pk]
    assert after["gpus"] == 6
    charged_mb = sum(r.held_vram_mb - r.covered_vram_mb for r in ranks(first) + ranks(second))
    assert charged_mb > 0
    assert after["vram_gib"] == pytest.approx(in_use["vram_gib"] + charged_mb / 1024)


def test_a_ray_node_holding_no_gpus_leaves_the_ranks_charged_in_full(owner, workspace, gpu_ray):
    RayNode.objects.filter(ray_cluster=gpu_ray).update(req_gpus=0, req_vram_mb=0)  # as a process-runtime one
    endpoint = create(owner, gpu_ray)
    assert [(r.held_gpus, r.covered_gpus, r.covered_vram_mb) for r in ranks(endpoint)] == [(1, 0, 0), (1, 0, 0)]
    assert usage([workspace.pk])[workspace.pk]["gpus"] == 2


def _worker_dies(ray):
    """The head's status no longer lists the worker (its container was killed): raymgr fails it."""
    head = RayNode.objects.get(ray_cluster=ray, role=RayNodeRole.HEAD)
    status = {"nodes": [{"member_id": str(head.pk), "ray_node_id": "aa" * 28, "is_head": True, "alive": True}]}
    services.ray_cluster_record_status(cluster=ray, status=status)


def test_a_dead_ray_worker_fails_the_group_and_it_comes_back_when_the_cluster_is_whole(owner, ray):
    endpoint = run(create(owner, ray))
    assert endpoint.status == EndpointStatus.RUNNING
    leader, follower = ranks(endpoint)
    _worker_dies(ray)
    dead = RayNode.objects.get(pk=follower.ray_node)
    assert dead.status == RayNodeStatus.FAILED
    assert "no longer lists this worker" in dead.failure_reason
    endpoints_heal_tick()
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.STOPPING
    event = endpoint.events.get(kind="endpoint.group_failed")
    assert f"Ray worker {dead.pk.hex[:8]}" in event.message
    assert "is failed" in event.message
    assert event.data["stopped_ranks"] == [0, 1]
    leader, follower = ranks(endpoint)
    assert leader.stop_command.payload == {"endpoint_id": leader.server_id}
    for rank in (leader, follower):
        agent_side.result(rank.stop_command)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.FAILED
    assert endpoint.failure_code == "group_member_lost"
    assert "no longer lists this worker" in endpoint.failure_message
    assert endpoints_heal_tick() == {str(endpoint.pk): 0}  # the cluster is not whole: it waits
    # the Ray autoscaler starts a worker again (min_workers 1): the group starts again on it
    services.autoscale_pass()
    new_start = last_command("ray.worker.start", cluster_id=str(ray.pk))
    finish(new_start, data={"container_id": "c-w2", "ray_node_id": "dd" * 28})
    new_worker = RayNode.objects.get(ray_cluster=ray, role=RayNodeRole.WORKER, status=RayNodeStatus.RUNNING)
    assert endpoints_heal_tick() == {str(endpoint.pk): 2}
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.PENDING
    assert endpoint.failure_code == ""
    leader, follower = ranks(endpoint)
    assert follower.ray_node == str(new_worker.pk)
    assert follower.start_command.payload["group"]["node_rank"] == 1
    assert "started again" in endpoint.events.get(kind="endpoint.group_restarted").message
    assert run(endpoint).status == EndpointStatus.RUNNING


def test_a_follower_whose_server_exits_fails_the_group_and_the_leader_is_stopped(owner, ray):
    endpoint = run(create(owner, ray))
    leader, follower = ranks(endpoint)
    agent_side.inventory(follower.node, models=[LLAMA], endpoints=[])  # the follower's rank is gone
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.FAILED  # one rank down: the group serves nothing
    endpoints_heal_tick()
    leader.refresh_from_db()
    assert leader.status == EndpointStatus.STOPPING
    endpoint.refresh_from_db()
    assert f"rank 1 (follower) on node {follower.node.name} failed" in endpoint.group_failure
    agent_side.result(leader.stop_command)
    endpoints_heal_tick()  # the Ray cluster is whole: the group starts again at once
    leader.refresh_from_db()
    assert leader.status == EndpointStatus.PENDING


def test_a_rank_that_fails_to_start_fails_the_group_without_restarts(owner, ray):
    endpoint = create(owner, ray)
    _leader, follower = ranks(endpoint)
    agent_side.error(follower.start_command, "internal", "follower rank exited with status 1")
    endpoints_heal_tick()
    endpoint.refresh_from_db()
    assert endpoint.group_failure_code == "group_start_failed"
    agent_side.result(ranks(endpoint)[0].stop_command)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.FAILED
    assert "follower rank exited" in endpoint.failure_message
    assert endpoints_heal_tick() == {}  # not started again: it would fail alike
    restarted = workloads.endpoint_restart(actor=owner, endpoint=endpoint)  # by hand it may
    assert restarted.status == EndpointStatus.PENDING


def test_a_draining_rank_node_moves_the_group(owner, ray):
    endpoint = run(create(owner, ray))
    _leader, follower = ranks(endpoint)
    Node.objects.filter(pk=follower.node_id).update(status=NodeStatus.DRAINING)
    endpoints_heal_tick()
    event = endpoint.events.get(kind="endpoint.group_moving")
    assert "is draining" in event.message
    endpoint.refresh_from_db()
    assert endpoint.group_failure_code == "group_moving"


def test_stop_ends_every_rank_and_the_group_is_not_healed(owner, ray):
    endpoint = run(create(owner, ray))
    workloads.endpoint_stop(actor=owner, endpoint=endpoint)
    stops = [r.stop_command for r in ranks(endpoint)]
    assert all(s is not None for s in stops)
    for stop in stops:
        agent_side.result(stop)
    endpoint.refresh_from_db()
    assert (endpoint.status, endpoint.failure_code) == (EndpointStatus.STOPPED, "")
    assert endpoints_heal_tick() == {}
    with pytest.raises(IllegalTransition):
        workloads.endpoint_update(
            actor=owner, endpoint=run(workloads.endpoint_restart(actor=owner, endpoint=endpoint)), revision="v2"
        )


def test_the_ray_autoscaler_never_removes_a_worker_a_rank_uses():
    policy = autoscaler.ScalingPolicy(min_workers=0, max_workers=2, idle_timeout_s=60)
    idle = [
        autoscaler.WorkerState("w-rank", idle_s=600, resources={"CPU": 1}, pinned=True),
        autoscaler.WorkerState("w-free", idle_s=600, resources={"CPU": 1}),
    ]
    decision = autoscaler.decide(policy, idle, autoscaler.ClusterDemand(pending=[]))
    assert decision.remove == ["w-free"]
    assert any("distributed endpoint's rank" in r for r in decision.reasons)


def test_the_autoscale_pass_pins_the_workers_ranks_run_on(owner, ray):
    endpoint = run(create(owner, ray))
    worker = RayNode.objects.get(ray_cluster=ray, role=RayNodeRole.WORKER)
    ray.min_workers = 0
    ray.save(update_fields=["min_workers"])
    RayNode.objects.filter(pk=worker.pk).update(idle_s=10_000)
    head = RayNode.objects.get(ray_cluster=ray, role=RayNodeRole.HEAD)
    status = {
        "nodes": [
            {"member_id": str(head.pk), "ray_node_id": "aa" * 28, "is_head": True, "alive": True},
            {"member_id": str(worker.pk), "ray_node_id": "cc" * 28, "idle_s": 10_000, "alive": True},
        ]
    }
    services.ray_cluster_record_status(cluster=ray, status=status)
    services.autoscale_pass()
    worker.refresh_from_db()
    assert worker.status == RayNodeStatus.RUNNING  # not drained
    assert not Command.objects.filter(command_type="ray.node.drain").exists()
    assert ray.events.filter(message__contains="a distributed endpoint's rank runs on it").exists()
    assert endpoint.replicas.filter(ray_node=str(worker.pk), status=EndpointStatus.RUNNING).exists()


@pytest.fixture
def api(api_client_for, owner):
    return api_client_for(owner)


def test_the_api_creates_a_group_and_shows_its_ranks_with_their_ray_nodes(api, ray):
    body = {"cluster": str(ray.compute_cluster_id), "model_id": LLAMA.model_id, "ray_cluster": str(ray.pk)}
    created = api.post("/api/v1/endpoints/", {**body, "pipeline_parallel": 2}, format="json")
    assert created.status_code == 201, created.content
    shown = created.json()
    assert (shown["ray_cluster"], shown["pipeline_parallel"], shown["tensor_parallel"]) == (str(ray.pk), 2, 1)
    ranks_shown = sorted(shown["replicas"], key=lambda r: r["group_rank"])
    assert next((r["group_rank"], r["group_role"], r["ray_node_label"]) for r in ranks_shown) == (0, "leader", "head")
    assert ranks_shown[1]["group_role"] == "follower"
    assert ranks_shown[1]["ray_node_label"].startswith("worker ")
    assert {r["ray_node_status"] for r in ranks_shown} == {"running"}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"pipeline_parallel": 3}, "pipeline_parallel"),
        ({"pipeline_parallel": 0}, "pipeline_parallel"),
        ({"tensor_parallel": "x"}, "tensor_parallel"),
        ({"ray_cluster": "00000000-0000-0000-0000-000000000000", "pipeline_parallel": 2}, "ray_cluster"),
        ({"ray_cluster": "nope"}, "ray_cluster"),
    ],
)
def test_the_api_refuses_a_bad_group_with_400_on_its_field(api, ray, change, field):
    body = {"cluster": str(ray.compute_cluster_id), "model_id": LLAMA.model_id, "ray_cluster": str(ray.pk)}
    refused = api.post("/api/v1/endpoints/", {**body, **change}, format="json")
    assert refused.status_code == 400, refused.content
    assert field in refused.json()
    assert not Endpoint.objects.exists()


def test_the_page_creates_a_group_and_shows_each_rank_with_its_ray_node(client, owner, ray):
    client.force_login(owner)
    compute = ray.compute_cluster_id
    tab = client.get(f"/compute/clusters/{compute}/endpoints/").content.decode()
    assert f'value="{ray.pk}"' in tab  # the running Ray cluster is offered
    form = {"model_id": LLAMA.model_id, "revision": "main", "gpus": 0, "min_vram_mb": 0, "min_replicas": 1}
    form |= {"idle_timeout_s": 300, "server_args": "", "ray_cluster": str(ray.pk)}
    bad = client.post(f"/compute/clusters/{compute}/endpoints/new/", {**form, "pipeline_parallel": 3})
    assert bad.status_code == 400
    assert "Must equal the Ray cluster&#x27;s nodes" in bad.content.decode()
    assert not Endpoint.objects.exists()
    done = client.post(f"/compute/clusters/{compute}/endpoints/new/", {**form, "pipeline_parallel": 2})
    assert done.status_code == 302, done.content.decode()[:2000]
    endpoint = run(Endpoint.objects.get())
    detail = client.get(_detail_url(endpoint)).content.decode()
    assert "2 pipeline stages (one per Ray node)" in detail
    assert 'class="rank">0 <span class="muted small">leader' in detail
    assert 'class="rank">1 <span class="muted small">follower' in detail
    assert 'head <span class="status running">running</span>' in detail


def _detail_url(endpoint) -> str:
    from django.urls import reverse

    return reverse("workloads:endpoint_detail", args=[endpoint.pk])


def test_a_failed_group_waiting_for_its_ray_cluster_is_stopped_at_once_and_never_restarted(owner, ray):
    endpoint = run(create(owner, ray))
    _worker_dies(ray)
    endpoints_heal_tick()
    for rank in ranks(endpoint):
        agent_side.result(rank.stop_command)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.FAILED
    stopped = workloads.endpoint_stop(actor=owner, endpoint=endpoint)
    assert stopped.status == EndpointStatus.STOPPED
    services.autoscale_pass()  # the Ray cluster becomes whole again
    finish(last_command("ray.worker.start", cluster_id=str(ray.pk)), data={"container_id": "c-w2"})
    assert endpoints_heal_tick() == {}
    assert Command.objects.filter(command_type="endpoint.start").count() == 2  # the first start's, only


def test_a_ray_worker_not_yet_joined_is_not_failed_by_a_status_without_it(owner, ray):
    worker = RayNode.objects.get(ray_cluster=ray, role=RayNodeRole.WORKER)
    RayNode.objects.filter(pk=worker.pk).update(ray_node_id="")  # started, not yet seen by Ray
    _worker_dies(ray)
    worker.refresh_from_db()
    assert worker.status == RayNodeStatus.RUNNING


def test_a_hung_leader_fails_the_group_which_restarts_only_once_its_stop_is_done(owner, ray):
    endpoint = run(create(owner, ray))
    leader, follower = ranks(endpoint)
    hung = protocol.EndpointInfo(
        endpoint_id=leader.server_id, model_id=LLAMA.model_id, port=8001, status="unresponsive"
    )
    agent_side.inventory(leader.node, models=[LLAMA], endpoints=[hung])  # the agent's probe of the leader failed
    leader.refresh_from_db()
    assert leader.status == EndpointStatus.FAILED
    assert leader.stop_command.status != "succeeded"  # its hung server is told to stop
    endpoints_heal_tick()
    endpoint.refresh_from_db()
    assert "rank 0 (leader)" in endpoint.group_failure
    assert "unresponsive" in endpoint.group_failure
    # in the group's words: probed with a completion, and no replacement of its own (the group restarts)
    assert "(a one-token completion)" in endpoint.group_failure
    assert "GET /health" not in endpoint.group_failure
    assert "replacement" not in endpoint.group_failure
    follower.refresh_from_db()
    agent_side.result(follower.stop_command)
    endpoints_heal_tick()
    assert Command.objects.filter(command_type="endpoint.start").count() == 2  # the leader's stop still runs
    agent_side.result(leader.stop_command)
    endpoints_heal_tick()
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.PENDING
    assert endpoint.master_port == 29501  # not the port the hung leader may still hold
    assert {r.start_command.payload["group"]["master_port"] for r in ranks(endpoint)} == {29501}


def _offline(node) -> None:
    Node.objects.filter(pk=node.pk).update(status=NodeStatus.OFFLINE)


def _starts() -> int:
    return Command.objects.filter(command_type="endpoint.start").count()


def test_a_rank_whose_node_went_offline_restarts_on_the_ray_clusters_new_worker_without_waiting(
    owner, ray, compute, add_node, client
):
    agent_side.inventory(add_node(compute, "cpu-3", memory_mb=32000), models=[LLAMA])  # room for a new worker
    endpoint = run(create(owner, ray))
    _leader, old = ranks(endpoint)
    gone = old.node
    _offline(gone)
    endpoints_heal_tick()
    failed = endpoint.events.get(kind="endpoint.group_failed")
    assert f"node {gone.name}: the node is offline" in failed.message
    assert f"(rank 1's stop waits for node {gone.name} to come back)" in failed.message
    assert "without waiting for that stop where the Ray cluster places the rank on another node" in failed.message
    agent_side.result(ranks(endpoint)[0].stop_command)
    old.refresh_from_db()
    assert old.status == EndpointStatus.STOPPING  # its stop is queued until the node returns
    assert endpoints_heal_tick() == {str(endpoint.pk): 0}  # the Ray cluster still places rank 1 there: it waits
    assert _starts() == 2
    # the Ray cluster replaces its worker on another node (the head no longer lists the lost one)
    _worker_dies(ray)
    services.autoscale_pass()
    finish(last_command("ray.worker.start", cluster_id=str(ray.pk)), data={"container_id": "c-w2"})
    new_worker = RayNode.objects.get(ray_cluster=ray, role=RayNodeRole.WORKER, status=RayNodeStatus.RUNNING)
    assert new_worker.node.name == "cpu-3"
    assert endpoints_heal_tick() == {str(endpoint.pk): 2}  # without waiting for the offline node's stop
    _leader, moved = ranks(endpoint)
    assert (moved.group_rank, moved.node_id, moved.ray_node) == (1, new_worker.node_id, str(new_worker.pk))
    assert moved.replacement_of_id == old.pk
    assert moved.server_id != old.server_id  # a fresh server id: the old one's late outcomes stay its own
    assert moved.start_command.payload["endpoint_id"] == moved.server_id
    event = endpoint.events.get(kind="endpoint.group_restarted")
    assert f"rank 1 moved from node {gone.name} to cpu-3 as server {moved.server_id}" in event.message
    assert f"its stop stays queued and ends it when {gone.name} comes back" in event.message
    assert event.data["moved_ranks"] == [1]
    assert run(endpoint).status == EndpointStatus.RUNNING
    # the page lists both while the old one stops: the new one as its replacement
    client.force_login(owner)
    page = client.get(_detail_url(endpoint)).content.decode()
    old_row = page[page.index(f'data-replica="{old.server_id}"') :]
    assert '<span class="status stopping">' in old_row[: old_row.index("</tr>")]
    new_row = page[page.index(f'data-replica="{moved.server_id}"') :]
    assert "replacement" in new_row[: new_row.index("</tr>")]
    # the old rank's stop is kept: sent when its node reconnects, it ends the old server alone
    old.refresh_from_db()
    assert old.status == EndpointStatus.STOPPING
    assert old.stop_command.status == "queued"
    assert old.stop_command.payload == {"endpoint_id": old.server_id}
    Node.objects.filter(pk=gone.pk).update(status=NodeStatus.ONLINE)
    assert old.stop_command in command_pending_for_node(node=gone)
    agent_side.result(old.stop_command)
    old.refresh_from_db()
    moved.refresh_from_db()
    assert (old.status, moved.status) == (EndpointStatus.STOPPED, EndpointStatus.RUNNING)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.RUNNING
    assert endpoints_heal_tick() == {str(endpoint.pk): 0}
    assert _starts() == 4


def test_a_rank_placed_on_its_own_node_again_waits_for_its_stop(owner, ray):
    endpoint = run(create(owner, ray))
    _leader, follower = ranks(endpoint)
    _offline(follower.node)
    endpoints_heal_tick()
    agent_side.result(ranks(endpoint)[0].stop_command)
    # the node comes back with its Ray worker still running: the group goes there again, after the old server
    Node.objects.filter(pk=follower.node_id).update(status=NodeStatus.ONLINE)
    agent_side.ack(ranks(endpoint)[1].stop_command)
    assert endpoints_heal_tick() == {str(endpoint.pk): 0}
    assert _starts() == 2
    agent_side.result(ranks(endpoint)[1].stop_command)
    assert endpoints_heal_tick() == {str(endpoint.pk): 2}
    _leader, again = ranks(endpoint)
    assert (again.pk, again.server_id, again.node_id) == (follower.pk, follower.server_id, follower.node_id)
    assert not endpoint.replicas.filter(replacement_of__isnull=False).exists()
    assert "moved" not in endpoint.events.get(kind="endpoint.group_restarted").message


def test_a_group_down_while_a_ranks_stop_waits_on_its_offline_node_can_be_stopped(owner, ray, compute, add_node):
    agent_side.inventory(add_node(compute, "cpu-3", memory_mb=32000), models=[LLAMA])
    endpoint = run(create(owner, ray))
    _leader, old = ranks(endpoint)
    _offline(old.node)
    endpoints_heal_tick()
    agent_side.result(ranks(endpoint)[0].stop_command)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.STOPPING  # rank 1's stop is queued on its offline node
    stopped = workloads.endpoint_stop(actor=owner, endpoint=endpoint)  # the user gives up on it: never restarted
    assert stopped.group_failure_code == "group_stopped"
    _worker_dies(ray)
    services.autoscale_pass()
    finish(last_command("ray.worker.start", cluster_id=str(ray.pk)), data={"container_id": "c-w2"})
    endpoints_heal_tick()
    assert _starts() == 2
    Node.objects.filter(pk=old.node_id).update(status=NodeStatus.ONLINE)
    old.refresh_from_db()
    agent_side.result(old.stop_command)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.STOPPED
    assert endpoints_heal_tick() == {}
    assert _starts() == 2


def test_a_rank_left_on_an_offline_node_is_charged_in_full_once_its_ray_node_counts_no_more(
    owner, workspace, gpu_ray, compute, add_node
):
    agent_side.inventory(add_node(compute, "gpu-3", gpus=2, memory_mb=128000), models=[LLAMA])
    endpoint = run(create(owner, gpu_ray, tensor_parallel=2))
    gpus_in_use = lambda: usage([workspace.pk])[workspace.pk]["gpus"]  # noqa: E731
    assert gpus_in_use() == 4  # the two Ray nodes' GPUs, the ranks on them charged nothing more
    _leader, old = ranks(endpoint)
    _offline(old.node)
    endpoints_heal_tick()
    agent_side.result(ranks(endpoint)[0].stop_command)
    old.refresh_from_db()
    assert (old.status, old.covered_gpus) == (EndpointStatus.STOPPING, 2)  # its stop waits for the node
    assert gpus_in_use() == 4
    _worker_dies(gpu_ray)  # raymgr fails the worker: its Ray node counts no more, the rank's server still holds 2
    assert RayNode.objects.get(pk=old.ray_node).status == RayNodeStatus.FAILED
    endpoints_heal_tick()
    old.refresh_from_db()
    assert (old.status, old.covered_gpus, old.covered_vram_mb) == (EndpointStatus.STOPPING, 0, 0)
    assert gpus_in_use() == 4  # the head's 2 + the offline rank's 2 (before: 2, those GPUs counted nowhere)
    # the Ray cluster's new worker on gpu-3 and the group started again there: all three nodes' GPUs count
    services.autoscale_pass()
    finish(
        last_command("ray.worker.start", cluster_id=str(gpu_ray.pk)),
        data={"container_id": "c-w2", "ray_node_id": "dd" * 28},
    )
    assert endpoints_heal_tick() == {str(endpoint.pk): 2}
    assert [r.covered_gpus for r in ranks(endpoint)] == [2, 2]
    assert gpus_in_use() == 6
    # the old node returns and its rank's stop ends the old server: its GPUs are free again
    Node.objects.filter(pk=old.node_id).update(status=NodeStatus.ONLINE)
    agent_side.result(old.stop_command)
    assert gpus_in_use() == 4
    assert workloads.ranks_charge_released() == 0  # nothing left to charge again

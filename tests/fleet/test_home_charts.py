"""The home page's pictures: per-minute rollups in Redis, commands per minute from the rows, pinned queries."""

from __future__ import annotations

import datetime as dt
import json
import re
import time
import uuid

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from agent import protocol
from cleverthis import fleet_history
from cleverthis.fleet_charts import workspace_charts
from fleet import services
from fleet.models import Command, CommandStatus
from fleet.proxy import request_meter
from kernel import redis_client, timeseries
from raymgr.models import RayCluster, RayClusterStatus

pytestmark = pytest.mark.django_db

T0 = 1_700_000_000.0 - 1_700_000_000.0 % 60  # the start of a minute


@pytest.fixture(autouse=True)
def clean_series():
    client = redis_client.redis_client()
    yield client
    keys = list(client.scan_iter(match=f"{timeseries.KEY_PREFIX}*"))
    if keys:
        client.delete(*keys)


def test_series_set_add_max_per_minute_and_gaps_stay_empty():
    timeseries.record([timeseries.Write("s", "g", 3), timeseries.Write("s", "n", 2, "add")], now=T0)
    timeseries.record(
        [timeseries.Write("s", "g", 5), timeseries.Write("s", "n", 1, "add"), timeseries.Write("s", "m", 7, "max")],
        now=T0 + 30,
    )
    timeseries.record([timeseries.Write("s", "m", 4, "max"), timeseries.Write("s", "g", 9, at=T0 + 180)], now=T0 + 40)
    buckets = timeseries.read(["s"], now=T0 + 180)["s"]
    assert len(buckets) == timeseries.SLOTS
    assert buckets[-4] == {"g": 5, "n": 3, "m": 7}  # the last sample wins, counters add, max keeps the largest
    assert buckets[-3] == buckets[-2] == {}
    assert buckets[-1] == {"g": 9}
    # a minute older than the window is not read, and its key expires on its own
    assert timeseries.read(["s"], now=T0 + 3600)["s"][0] == {}
    ttl = redis_client.redis_client().ttl(f"{timeseries.KEY_PREFIX}s:{timeseries.minute_of(T0)}")
    assert 0 < ttl <= timeseries.STEP_S * (timeseries.SLOTS + 1)


def test_sample_records_nodes_utilization_and_ray_by_state_in_three_queries(
    cluster, other_cluster, register_node, owner, django_assert_num_queries
):
    busy = register_node(cluster, "busy")
    gpu = protocol.GpuInfo(index=0, name="H100", memory_total_mb=1000, memory_used_mb=250, utilization_percent=80)
    services.node_record_heartbeat(
        node_id=busy.pk, heartbeat=protocol.Heartbeat(cpu_percent=40, memory_percent=50, gpus=[gpu])
    )
    register_node(cluster, "gone", online=False)
    services.node_cordon(node=register_node(cluster, "resting"), actor=owner)
    register_node(other_cluster, "theirs")
    ws = cluster.workspace
    RayCluster.objects.create(workspace=ws, compute_cluster=cluster, name="a", status=RayClusterStatus.RUNNING)
    RayCluster.objects.create(workspace=ws, compute_cluster=cluster, name="b", status=RayClusterStatus.FAILED)
    with django_assert_num_queries(3):
        fleet_history.fleet_history_sample(now=T0)
    first = fleet_history.fleet_history(workspace_ids=[ws.pk], now=T0)[ws.pk][-1]
    states = [first[f"nodes.{s}"] for s in ("online", "offline", "cordoned", "draining")]
    assert states == [1, 1, 1, 0]
    assert (first["ray.running"], first["ray.failed"], first["ray.pending"]) == (1, 1, 0)
    # over the reporting nodes (busy and the cordoned one, not the offline one), weighted by cores,
    # memory and GPUs: busy reports 40 % CPU, 50 % memory, 80 % GPU; the cordoned one nothing yet
    assert (first["util.cpu"], first["util.memory"], first["util.gpu"]) == (20, 25, 40)
    assert first["util.vram"] == round(100 * (250 + 100) / (1000 + 80000), 2)
    for i in range(5):
        register_node(cluster, f"more-{i}")
    with django_assert_num_queries(3):
        assert fleet_history.fleet_history_sample(now=T0 + 60) >= 2
    later = fleet_history.fleet_history(workspace_ids=[ws.pk, other_cluster.workspace_id], now=T0 + 60)
    mine, theirs = later[ws.pk][-1], later[other_cluster.workspace_id][-1]
    assert (mine["nodes.online"], mine["nodes.offline"]) == (6, 1)
    assert theirs["nodes.online"] == 1
    assert theirs["ray.running"] == 0


def test_commands_per_minute_counts_failures_and_uses_the_cluster_index(cluster, register_node):
    node = register_node(cluster)
    now = timezone.now()
    for minutes_ago, status in ((0, CommandStatus.SUCCEEDED), (0, CommandStatus.FAILED), (2, CommandStatus.FAILED)):
        c = Command.objects.create(
            node=node, cluster=cluster, command_type="container.stop", idempotency_key=uuid.uuid4().hex, status=status
        )
        Command.objects.filter(pk=c.pk).update(created_at=now - dt.timedelta(minutes=minutes_ago))
    old = Command.objects.create(
        node=node, cluster=cluster, command_type="container.stop", idempotency_key=uuid.uuid4().hex
    )
    Command.objects.filter(pk=old.pk).update(created_at=now - dt.timedelta(hours=2))
    per_minute = fleet_history.commands_per_minute(
        cluster_workspaces={cluster.pk: cluster.workspace_id}, now=now.timestamp()
    )[cluster.workspace_id]
    assert per_minute[-1] == {"commands.sent": 2, "commands.failed": 1}
    assert per_minute[-3] == {"commands.sent": 1, "commands.failed": 1}
    assert sum(b.get("commands.sent", 0) for b in per_minute) == 3  # the one two hours ago is outside
    # index-friendly: with sequential scans off the planner reads the (cluster, system, created_at) index
    rows = Command.objects.filter(
        cluster_id__in=[cluster.pk], system__in=[False, True], created_at__gte=now - dt.timedelta(hours=1)
    ).order_by()
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        plan = rows.explain()
    assert "command_cluster_system_created" in plan, plan


def test_charts_from_rollups_have_text_alternatives():
    history = [{} for _ in range(timeseries.SLOTS)]
    history[-1] = {"nodes.online": 2, "nodes.offline": 1, "nodes.cordoned": 0, "nodes.draining": 0, "util.cpu": 30}
    history[-1] |= {"ep.requests": 4, "ep.errors": 1, "ep.latency_ms_sum": 400, "ep.latency_ms_max": 250}
    commands = [{} for _ in range(timeseries.SLOTS)]
    commands[-2] = {"commands.sent": 5, "commands.failed": 2}
    charts = {c.key: c for c in workspace_charts(history=history, commands=commands)}
    assert list(charts) == ["nodes", "utilization", "commands", "requests", "latency", "ray"]
    assert charts["nodes"].summary.startswith("Online: now 2, min 2, max 2; Offline: now 1")
    assert "gpu" not in charts["utilization"].series  # no GPU reported: CPU and memory only
    assert charts["latency"].series["mean"][-1] == 100  # 400 ms over 4 requests
    assert charts["commands"].rows == [(1, [5, 2])]  # minutes ago, then one value per series
    assert json.loads(charts["requests"].spec)["max"] is None  # counts: the scale fits the data
    assert not charts["ray"].has_data
    assert charts["ray"].summary == "Nothing recorded in the last hour yet."


def test_home_page_draws_the_last_hour_with_pinned_queries(
    client, owner, workspace, cluster, register_node, django_assert_num_queries
):
    node = register_node(cluster, "busy")
    Command.objects.create(
        node=node,
        cluster=cluster,
        command_type="container.create",
        idempotency_key=uuid.uuid4().hex,
        status=CommandStatus.FAILED,
        finished_at=timezone.now(),
    )
    fleet_history.fleet_history_sample()
    request_meter.observe(timeseries.workspace_series(workspace.pk), 200, 0.120)
    request_meter.observe(timeseries.workspace_series(workspace.pk), 502, 0.040)
    request_meter.flush()
    client.force_login(owner)
    client.get("/")
    with django_assert_num_queries(14) as first:  # + quota limits and usage
        page = client.get("/").content.decode()
    for key in ("nodes", "utilization", "commands", "requests", "latency", "ray"):
        assert f'id="chart-{workspace.pk}-{key}"' in page
    assert re.search(r'aria-label="Nodes by state, last hour: Online: now 1,', page)
    assert "Commands: now 1, min 0, max 1; Failed: now 1" in page
    assert "Requests: now 2, min 0, max 2; Errors (5xx): now 1" in page
    assert "Mean: now 80 ms" in page
    assert "Slowest: now 120 ms" in page
    assert "js/charts.js" in page
    # more clusters, nodes, commands and history: the same queries
    for i in range(3):
        services.cluster_create(actor=owner, workspace=workspace, name=f"more-{i}")
        register_node(cluster, f"late-{i}")
    fleet_history.fleet_history_sample(now=time.time() - 120)
    with django_assert_num_queries(len(first.captured_queries)):
        client.get("/")
    # htmx (its own 30 s refresh, or a push): just the workspaces, still polling
    part = client.get("/", HTTP_HX_REQUEST="true").content.decode()
    assert part.lstrip().startswith('<div id="fleet"')
    assert 'hx-trigger="every 30s"' in part
    assert "data-push-any" in part
    assert "<h1>" not in part


def test_beat_samples_the_fleet_every_minute():
    entry = settings.CELERY_BEAT_SCHEDULE["fleet-history-sample"]
    assert entry == {"task": "cleverthis.tasks.sample_fleet_history", "schedule": 60.0}
    from cleverthis.celery import app
    from cleverthis.tasks import sample_fleet_history

    assert app.tasks[entry["task"]].name == sample_fleet_history.name

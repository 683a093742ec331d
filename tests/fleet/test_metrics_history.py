"""The nodes' utilization history: bounded rings in Redis, downsampled on write, drawn on the pages."""

from __future__ import annotations

import json
import re

import pytest
import redis

from agent import protocol
from fleet import metrics_history, services
from fleet.metrics_history import DAY, HOUR, Sample
from kernel import redis_client

T0 = 1_800_000_000.0  # a fixed "now" (a whole hour) so buckets are predictable


@pytest.fixture(autouse=True)
def clean_history():
    client = redis_client.redis_client()
    yield client
    keys = list(client.scan_iter(match=f"{metrics_history.KEY_PREFIX}*"))
    if keys:
        client.delete(*keys)


def test_beats_in_one_bucket_are_averaged_and_gaps_stay_empty():
    metrics_history.record([Sample("n1", cpu=10, memory=40)], now=T0)
    metrics_history.record([Sample("n1", cpu=30, memory=60)], now=T0 + 20)
    metrics_history.record([Sample("n1", cpu=90, memory=50, gpu=75, vram=25)], now=T0 + 180)
    series = metrics_history.history(["n1"], HOUR, now=T0 + 180)["n1"]
    assert len(series["cpu"]) == HOUR.slots
    assert series["cpu"][-4:] == [20.0, None, None, 90.0]  # mean of the first minute, two silent minutes
    assert series["memory"][-4] == 50.0
    assert series["gpu"][-4:] == [None, None, None, 75.0]  # no GPU reported: no value, not zero
    assert series["vram"][-1] == 25.0
    day = metrics_history.history(["n1"], DAY, now=T0 + 180)["n1"]
    assert len(day["cpu"]) == DAY.slots
    assert day["cpu"][-1] == pytest.approx((10 + 30 + 90) / 3, abs=0.01)  # one 15-minute bucket


def test_the_ring_stays_bounded_and_old_buckets_leave_the_window(clean_history):
    for minute in range(200):  # more than three hours of one beat a minute
        metrics_history.record([Sample("n2", cpu=minute % 100, memory=1)], now=T0 + minute * 60)
    assert clean_history.hlen(f"{metrics_history.KEY_PREFIX}n2:hour") == HOUR.slots
    assert clean_history.hlen(f"{metrics_history.KEY_PREFIX}n2:day") <= DAY.slots
    assert 0 < clean_history.ttl(f"{metrics_history.KEY_PREFIX}n2:hour") <= HOUR.slots * HOUR.step_s
    later = metrics_history.history(["n2"], HOUR, now=T0 + 199 * 60 + 30 * 60)["n2"]["cpu"]
    assert later[:30] == [float(m % 100) for m in range(170, 200)]  # the last 30 minutes of beats
    assert later[30:] == [None] * 30  # and nothing since


def test_values_are_clamped_to_percentages():
    metrics_history.record([Sample("n3", cpu=250, memory=-4)], now=T0)
    series = metrics_history.history(["n3"], HOUR, now=T0)["n3"]
    assert (series["cpu"][-1], series["memory"][-1]) == (100.0, 0.0)


def test_a_redis_outage_neither_fails_a_heartbeat_nor_a_page(monkeypatch, caplog):
    monkeypatch.setattr(redis_client, "_client", redis.Redis(port=1, socket_connect_timeout=1))
    metrics_history.record([Sample("n4", cpu=1, memory=1)], now=T0)
    assert metrics_history.history(["n4"], HOUR, now=T0)["n4"]["cpu"] == [None] * HOUR.slots
    assert "metrics history not" in caplog.text


def _gpu_beat(cpu: float) -> protocol.Heartbeat:
    gpu = protocol.GpuInfo(index=0, name="H100", memory_total_mb=80000, memory_used_mb=20000, utilization_percent=60)
    return protocol.Heartbeat(cpu_percent=cpu, memory_percent=30, gpus=[gpu])


def test_a_heartbeat_is_still_one_query_and_lands_in_the_history(cluster, register_node, django_assert_num_queries):
    node = register_node(cluster)
    with django_assert_num_queries(1):
        services.node_record_heartbeat(node_id=node.pk, heartbeat=_gpu_beat(42))
    series = metrics_history.history([node.pk])[str(node.pk)]
    assert (series["cpu"][-1], series["memory"][-1], series["gpu"][-1], series["vram"][-1]) == (42, 30, 60, 25)


def test_a_heartbeat_for_an_unknown_node_records_nothing(db, clean_history):
    services.node_record_heartbeats(beats=[("00000000-0000-0000-0000-000000000001", _gpu_beat(5))])
    assert not list(clean_history.scan_iter(match=f"{metrics_history.KEY_PREFIX}*"))


def test_deleting_a_node_forgets_its_history(
    cluster, register_node, owner, clean_history, django_capture_on_commit_callbacks
):
    node = register_node(cluster)
    services.node_record_heartbeat(node_id=node.pk, heartbeat=_gpu_beat(5))
    assert clean_history.exists(f"{metrics_history.KEY_PREFIX}{node.pk}:hour")
    with django_capture_on_commit_callbacks(execute=True):
        services.node_delete(node=node, actor=owner)
    assert not clean_history.exists(f"{metrics_history.KEY_PREFIX}{node.pk}:hour")


def test_node_page_draws_hour_and_day_charts_with_a_text_alternative(client, owner, cluster, register_node):
    node = register_node(cluster)
    services.node_record_heartbeat(node_id=node.pk, heartbeat=_gpu_beat(42))
    client.force_login(owner)
    page = client.get(f"/compute/nodes/{node.pk}/").content.decode()
    specs = [json.loads(s.replace("&quot;", '"')) for s in re.findall(r'data-chart="([^"]+)"', page)]
    assert [s["window"] for s in specs] == ["last hour", "last day"]
    assert specs[0]["series"]["cpu"][-1] == 42
    assert set(specs[0]["series"]) == {"cpu", "memory", "gpu", "vram"}
    assert "Utilization over the last hour: CPU: latest 42%, min 42%, max 42%" in page
    assert "<summary>Data table</summary>" in page
    assert "Minutes ago" in page
    assert "js/charts.js" in page


def test_nodes_tab_has_sparklines_and_pinned_queries(client, owner, cluster, register_node, django_assert_num_queries):
    nodes = [register_node(cluster, f"box-{i}") for i in range(2)]
    services.node_record_heartbeat(node_id=nodes[0].pk, heartbeat=_gpu_beat(42))
    client.force_login(owner)
    client.get(f"/compute/clusters/{cluster.pk}/nodes/", HTTP_HX_REQUEST="true")  # warm the session
    with django_assert_num_queries(6) as few:
        page = client.get(f"/compute/clusters/{cluster.pk}/nodes/", HTTP_HX_REQUEST="true").content.decode()
    assert 'aria-label="CPU, last hour: latest 42%, min 42%, max 42%"' in page
    assert 'aria-label="CPU, last hour: no data yet"' in page  # the second node has not beaten yet
    for i in range(2, 6):
        register_node(cluster, f"box-{i}")
    with django_assert_num_queries(len(few.captured_queries)):
        page = client.get(f"/compute/clusters/{cluster.pk}/nodes/", HTTP_HX_REQUEST="true").content.decode()
    assert page.count("data-sparkline=") >= 12


def test_node_page_queries_stay_pinned_whatever_the_history(
    client, owner, cluster, register_node, django_assert_num_queries
):
    node = register_node(cluster)
    client.force_login(owner)
    client.get(f"/compute/nodes/{node.pk}/")
    with django_assert_num_queries(8) as before:
        client.get(f"/compute/nodes/{node.pk}/")
    for minute in range(120):
        metrics_history.record([Sample(node.pk, cpu=minute % 100, memory=50)], now=T0 + minute * 60)
    services.node_record_heartbeat(node_id=node.pk, heartbeat=_gpu_beat(42))
    with django_assert_num_queries(len(before.captured_queries)):
        assert client.get(f"/compute/nodes/{node.pk}/").status_code == 200

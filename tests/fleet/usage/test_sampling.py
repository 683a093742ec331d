"""Node-, GPU- and container-seconds per cluster, sampled once a minute from what the heartbeats left."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleet.models import Node, NodeStatus
from fleet.usage import services, tasks
from fleet.usage.models import UsageRollup
from fleet.workloads.models import Container, ContainerStatus

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 5, 10, 7, 20, tzinfo=UTC)


def _node(cluster, name, *, gpus=0, status=NodeStatus.ONLINE, connected=True, heartbeat_ago=10):
    return Node.objects.create(
        cluster=cluster,
        name=name,
        hostname=name,
        status=status,
        connected=connected,
        gpu_count=gpus,
        last_heartbeat_at=NOW - timedelta(seconds=heartbeat_ago),
    )


def _seconds(cluster, granularity):
    row = UsageRollup.objects.get(subject_id=cluster.pk, granularity=granularity)
    return row.node_seconds, row.gpu_seconds, row.container_seconds


def test_each_live_node_its_gpus_and_running_containers_are_credited_for_the_minute(cluster, other_cluster):
    a = _node(cluster, "a", gpus=2)
    _node(cluster, "b", gpus=1, status=NodeStatus.CORDONED)  # cordoned: still up, still counted
    _node(cluster, "c", gpus=4, heartbeat_ago=600)  # heartbeat stale: not counted
    _node(cluster, "d", gpus=4, status=NodeStatus.OFFLINE)
    _node(cluster, "e", gpus=4, connected=False)
    _node(other_cluster, "x")
    for i, status in enumerate((ContainerStatus.RUNNING, ContainerStatus.RUNNING, ContainerStatus.EXITED)):
        Container.objects.create(node=a, cluster=cluster, name=f"c{i}", image="busybox", status=status)

    assert services.usage_sample(now=NOW) == 2
    minute = UsageRollup.objects.get(subject_id=cluster.pk, granularity="minute")
    assert minute.bucket_start == datetime(2026, 12, 5, 10, 6, tzinfo=UTC)  # the minute that ended
    assert (minute.workspace_id, minute.subject_kind, minute.api_key_id) == (cluster.workspace_id, "cluster", None)
    assert _seconds(cluster, "minute") == (120, 180, 120)
    assert _seconds(cluster, "hour") == (120, 180, 120)
    assert _seconds(other_cluster, "minute") == (60, 0, 0)


def test_a_second_run_for_the_same_minute_counts_nothing_twice(cluster):
    _node(cluster, "a", gpus=1)
    services.usage_sample(now=NOW)
    services.usage_sample(now=NOW + timedelta(seconds=30))  # the same minute again
    assert _seconds(cluster, "minute") == (60, 60, 0)
    assert _seconds(cluster, "hour") == (60, 60, 0)
    services.usage_sample(now=NOW + timedelta(minutes=1))  # the next minute: the hour adds up its minutes
    assert _seconds(cluster, "hour") == (120, 120, 0)
    assert UsageRollup.objects.filter(granularity="minute").count() == 2


def test_old_minute_rows_are_pruned_and_hour_rows_kept(cluster, settings):
    settings.USAGE_MINUTE_RETENTION_DAYS = 1
    _node(cluster, "a")
    services.usage_sample(now=NOW - timedelta(days=2))
    services.usage_sample(now=NOW)
    assert UsageRollup.objects.filter(granularity="minute").count() == 1
    assert UsageRollup.objects.filter(granularity="hour").count() == 2


def test_the_beat_runs_the_sampling_every_minute(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["fleet-usage-sample"]
    assert (entry["task"], entry["schedule"]) == (tasks.sample_usage.name, 60.0)

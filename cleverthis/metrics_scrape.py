"""`GET /metrics`: Prometheus text for the whole control plane, behind a bearer token (METRICS_TOKEN).

One scrape merges the instruments of every process on this machine (`kernel.metrics`, multiprocess
files) and adds gauges read from the database at that moment: nodes by status per cluster, commands by
type and status, Ray clusters by state, and each node's utilization and heartbeat age; and from the broker
(`cleverthis.dispatch_health`): whether it answers, each Celery worker's heartbeat age, the queue depths;
and from the per-replica figures every web process publishes (`fleet.replica_load`, summed over all
machines): each endpoint replica's requests in flight, tokens/s, and what the router did (requests routed,
affinity hits).
"""

from __future__ import annotations

import glob
import hmac
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

from cleverthis.dispatch_health import DispatchCollector
from fleet import replica_load
from fleet.models import Command, Node, NodeStatus
from fleet.workloads.models import Endpoint, EndpointReplica
from kernel import metrics  # noqa: F401  (names the multiprocess directory, creates it)
from raymgr.models import RayCluster, RayClusterStatus

log = logging.getLogger(__name__)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def forget_dead_processes(path: str) -> None:
    """Drop the live gauges (tunnels, open streams) of processes that exited without saying so.

    Their counters and histograms stay: totals keep counting what dead processes did.
    """
    for name in glob.glob(os.path.join(path, "gauge_live*_*.db")):
        pid = Path(name).stem.rsplit("_", 1)[-1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            mark_process_dead(int(pid), path)


class DatabaseCollector(Collector):
    """Gauges computed from the database at scrape time (right for any number of processes)."""

    def collect(self) -> Iterator[Metric]:
        yield from self._nodes()
        yield self._commands()
        yield self._ray_clusters()

    def _nodes(self) -> Iterator[Metric]:
        by_status = GaugeMetricFamily(
            "cleverthis_nodes", "Nodes per compute cluster and status.", labels=["workspace", "cluster", "status"]
        )
        clusters = {}
        counts = {}
        rows = (
            Node.objects.order_by()
            .values_list("cluster__workspace__slug", "cluster__name", "status")
            .annotate(n=Count("id"))
        )
        for workspace, cluster, status, n in rows:
            clusters[(workspace, cluster)] = True
            counts[(workspace, cluster, status)] = n
        for workspace, cluster in sorted(clusters):
            for status in NodeStatus.values:
                by_status.add_metric([workspace, cluster, status], counts.get((workspace, cluster, status), 0))
        yield by_status

        labels = ["workspace", "cluster", "node", "node_id"]
        age = GaugeMetricFamily(
            "cleverthis_node_heartbeat_age_seconds", "Seconds since the node's last heartbeat.", labels=labels
        )
        cpu = GaugeMetricFamily("cleverthis_node_cpu_percent", "CPU use of a connected node.", labels=labels)
        memory = GaugeMetricFamily("cleverthis_node_memory_percent", "Memory use of a connected node.", labels=labels)
        memory_used = GaugeMetricFamily(
            "cleverthis_node_memory_used_bytes", "Memory used on a connected node.", labels=labels
        )
        gpu = GaugeMetricFamily(
            "cleverthis_node_gpu_utilization_percent", "Mean GPU utilization of a connected node.", labels=labels
        )
        vram_used = GaugeMetricFamily(
            "cleverthis_node_vram_used_bytes", "GPU memory used on a connected node.", labels=labels
        )
        vram_total = GaugeMetricFamily("cleverthis_node_vram_total_bytes", "GPU memory of a node.", labels=labels)
        now = timezone.now()
        nodes = Node.objects.values_list(
            "cluster__workspace__slug",
            "cluster__name",
            "name",
            "id",
            "last_heartbeat_at",
            "connected",
            "cpu_percent",
            "memory_percent",
            "memory_used_mb",
            "gpu_utilization_percent",
            "vram_used_mb",
            "vram_total_mb",
        ).order_by("cluster__workspace__slug", "cluster__name", "name", "id")
        mib = 1024 * 1024
        for workspace, cluster, name, node_id, beat, connected, cpu_p, mem_p, mem_mb, gpu_p, vram_mb, vram_t in nodes:
            values = [workspace, cluster, name, str(node_id)]
            if beat is not None:
                age.add_metric(values, max(0.0, (now - beat).total_seconds()))
            if vram_t:
                vram_total.add_metric(values, vram_t * mib)
            if not connected:  # the last figures of a node that is away would read as current
                continue
            cpu.add_metric(values, cpu_p)
            memory.add_metric(values, mem_p)
            memory_used.add_metric(values, mem_mb * mib)
            if vram_t:
                gpu.add_metric(values, gpu_p)
                vram_used.add_metric(values, vram_mb * mib)
        yield from (age, cpu, memory, memory_used, gpu, vram_used, vram_total)

    def _commands(self) -> Metric:
        family = GaugeMetricFamily(
            "cleverthis_commands", "Commands stored, per type and status.", labels=["type", "status"]
        )
        rows = Command.objects.order_by().values_list("command_type", "status").annotate(n=Count("id"))
        for command_type, status, n in sorted(rows):
            family.add_metric([command_type, status], n)
        return family

    def _ray_clusters(self) -> Metric:
        family = GaugeMetricFamily(
            "cleverthis_ray_clusters", "Managed Ray clusters per workspace and state.", labels=["workspace", "state"]
        )
        counts = dict(
            ((workspace, status), n)
            for workspace, status, n in RayCluster.objects.order_by()
            .values_list("workspace__slug", "status")
            .annotate(n=Count("id"))
        )
        for workspace in sorted({w for w, _ in counts}):
            for state in RayClusterStatus.values:
                family.add_metric([workspace, state], counts.get((workspace, state), 0))
        return family


class ReplicaLoadCollector(Collector):
    """Each endpoint replica's shared figures at scrape time (nothing when Redis cannot be read)."""

    def collect(self) -> Iterator[Metric]:
        try:
            loads, queues = replica_load.read_all()
        except Exception:  # (Redis away: the other families still come)
            log.warning("replica load unreadable for /metrics", exc_info=True)
            return
        labels = ["workspace", "endpoint_id", "replica", "routing_policy"]
        families = {
            "in_flight": GaugeMetricFamily(
                "cleverthis_endpoint_replica_in_flight",
                "Requests in flight to an endpoint replica, over every web process.",
                labels=labels,
            ),
            "tokens_per_s": GaugeMetricFamily(
                "cleverthis_endpoint_replica_tokens_per_second",
                "Completion tokens per second an endpoint replica served, over every web process.",
                labels=labels,
            ),
            "routed": GaugeMetricFamily(
                "cleverthis_endpoint_replica_requests_routed",
                "Requests the router sent to an endpoint replica, counted by the web processes alive now.",
                labels=labels,
            ),
            "affinity_hits": GaugeMetricFamily(
                "cleverthis_endpoint_replica_affinity_hits",
                "Of those, requests whose session or prefix key went to this replica the time before (an "
                "estimate of prefix-cache reuse).",
                labels=labels,
            ),
        }
        decision = GaugeMetricFamily(
            "cleverthis_endpoint_replica_decision_seconds",
            "How long the router took to choose this replica, over the last window, by quantile (the upper bound "
            "of its bucket).",
            labels=[*labels, "quantile"],
        )
        if loads:
            rows = (
                EndpointReplica.objects.filter(server_id__in=list(loads))
                .values_list(
                    "server_id", "endpoint_id", "endpoint__cluster__workspace__slug", "endpoint__routing_policy"
                )
                .order_by("server_id")
            )
            for server_id, endpoint_id, workspace, policy in rows:
                load, values = loads[server_id], [workspace, str(endpoint_id), server_id, policy]
                for name, family in families.items():
                    family.add_metric(values, getattr(load, name))
                for quantile, figure in (("0.5", load.decision_p50_us), ("0.99", load.decision_p99_us)):
                    if figure is not None:
                        decision.add_metric([*values, quantile], figure / 1e6)
        yield from families.values()
        yield decision
        yield from _queue_families(queues)


def _queue_families(queues: dict[str, replica_load.QueueLoad]) -> Iterator[Metric]:
    """Each endpoint's wait queue: requests waiting now; of the last window the waits p50/p99 and the 429s."""
    labels = ["workspace", "endpoint_id"]
    waiting = GaugeMetricFamily(
        "cleverthis_endpoint_queue_depth",
        "Requests waiting in an endpoint's queue for a free replica slot, over every web process.",
        labels=labels,
    )
    wait = GaugeMetricFamily(
        "cleverthis_endpoint_queue_wait_seconds",
        "Queue wait of the requests admitted in the last window (0 for those admitted at once), by quantile "
        "(the upper bound of its bucket).",
        labels=[*labels, "quantile"],
    )
    refused = GaugeMetricFamily(
        "cleverthis_endpoint_queue_refused",
        "Requests refused with 429 (queue full or wait bound passed) in the last window.",
        labels=labels,
    )
    if queues:
        rows = Endpoint.objects.filter(pk__in=[k for k in queues if _is_uuid(k)]).order_by("pk")
        for endpoint_id, workspace in rows.values_list("pk", "cluster__workspace__slug"):
            queue, values = queues[str(endpoint_id)], [workspace, str(endpoint_id)]
            waiting.add_metric(values, queue.waiting)
            refused.add_metric(values, queue.refused)
            for quantile, figure in (("0.5", queue.wait_p50_s), ("0.99", queue.wait_p99_s)):
                if figure is not None:
                    wait.add_metric([*values, quantile], figure)
    yield from (waiting, wait, refused)


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def render() -> bytes:
    """The exposition text: every process's instruments merged, then the database gauges."""
    registry = CollectorRegistry()
    path = settings.PROMETHEUS_MULTIPROC_DIR
    forget_dead_processes(path)
    MultiProcessCollector(registry, path=path)
    registry.register(DatabaseCollector())
    registry.register(DispatchCollector())
    registry.register(ReplicaLoadCollector())
    return generate_latest(registry)


@never_cache
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus scrape target; needs `Authorization: Bearer <METRICS_TOKEN>` (401 without, 403 if wrong).

    With METRICS_TOKEN unset every request gets 403: the metrics are off.
    """
    token = settings.METRICS_TOKEN
    if not token:
        return HttpResponse("Metrics are off: set METRICS_TOKEN.\n", status=403, content_type="text/plain")
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given:
        response = HttpResponse("A bearer token is required.\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        return HttpResponse("Wrong metrics token.\n", status=403, content_type="text/plain")
    return HttpResponse(render(), content_type=CONTENT_TYPE_LATEST)

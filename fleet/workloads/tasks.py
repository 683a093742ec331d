"""Celery tasks for workloads: drain passes (one node on request, every draining node on the beat), and the
healing of endpoints whose replicas were lost, the endpoints' autoscaler and their scaling to zero (on the beat).

Task names are wire names and stay as they were when these lived in `fleet.tasks` / `fleet.workload_tasks`."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import DatabaseError
from django.utils import timezone

from fleet.models import Node, NodeStatus
from fleet.tasks import RETRYABLE
from fleet.workloads import drain, selectors
from fleet.workloads import services as workload_services
from fleet.workloads.services import benchmarks

logger = logging.getLogger(__name__)


@shared_task(name=drain.DRAIN_TASK, autoretry_for=RETRYABLE, retry_backoff=5, max_retries=5)
def drain_node(node_id: str) -> str | None:
    """One drain pass for `node_id`; returns the node's status afterwards (None if it is gone)."""
    return drain.drain_step(node_id=node_id).status


@shared_task(name="fleet.workload_tasks.drain_tick", autoretry_for=(DatabaseError,), max_retries=2)
def drain_tick() -> dict[str, str]:
    """Beat: one drain pass for every draining node (not in partition-paused clusters); {node_id: status}."""
    out: dict[str, str] = {}
    draining = (
        Node.objects.filter(status=NodeStatus.DRAINING)
        .exclude(cluster__automation_paused_until__gt=timezone.now())  # partition pause: hands off
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    for node_id in draining:
        try:
            out[str(node_id)] = drain.drain_step(node_id=node_id).status
        except Exception:  # one broken node must not stop the others' drains
            logger.exception("drain pass for node %s failed", node_id)
            out[str(node_id)] = "error"
    return out


@shared_task(name="fleet.workload_tasks.drain_node_now", autoretry_for=RETRYABLE, retry_backoff=5, max_retries=5)
def drain_node_now(node_id: str) -> dict:
    """One drain pass for `node_id` now; returns the DrainReport as a dict."""
    from dataclasses import asdict

    return asdict(drain.drain_step(node_id=node_id))


@shared_task(name="fleet.workload_tasks.endpoints_heal_tick", autoretry_for=(DatabaseError,), max_retries=2)
def endpoints_heal_tick() -> dict[str, int]:
    """Beat: one healing pass for every endpoint with a lost replica; {endpoint_id: replacements started}.
    First, ranks whose Ray node no longer holds what they covered are charged in full."""
    try:
        workload_services.ranks_charge_released()
    except Exception:  # the healing below must run whatever this did
        logger.exception("charging the ranks of released Ray nodes failed")
    out: dict[str, int] = {}
    for endpoint_id in workload_services.endpoints_to_heal():
        try:
            out[str(endpoint_id)] = len(workload_services.endpoint_heal(endpoint_id=endpoint_id))
        except Exception:  # one broken endpoint must not stop the others' healing
            logger.exception("healing pass for endpoint %s failed", endpoint_id)
            out[str(endpoint_id)] = -1
    return out


@shared_task(name="fleet.workload_tasks.endpoints_autoscale_tick", autoretry_for=(DatabaseError,), max_retries=2)
def endpoints_autoscale_tick() -> dict[str, int]:
    """Beat: one autoscaling pass for every autoscaled running endpoint; {endpoint_id: replicas started (+)
    or stopped (-)} for those that changed."""
    out: dict[str, int] = {}
    endpoint_ids = workload_services.endpoints_to_autoscale()
    loads = selectors.replica_loads_shown() if endpoint_ids else None  # one read for all (None: each pass tries)
    queues = selectors.queue_loads_shown() if endpoint_ids else None
    for endpoint_id in endpoint_ids:
        try:
            decision = workload_services.endpoint_autoscale(endpoint_id=endpoint_id, loads=loads, queues=queues)
        except Exception:  # one broken endpoint must not stop the others' scaling
            logger.exception("autoscaling pass for endpoint %s failed", endpoint_id)
            continue
        if decision is not None and decision.changed:
            out[str(endpoint_id)] = decision.changed
    return out


@shared_task(name="fleet.workload_tasks.endpoints_idle_tick", autoretry_for=(DatabaseError,), max_retries=2)
def endpoints_idle_tick() -> list[str]:
    """Beat: one idle pass for every running endpoint that may scale to zero; the ids of those scaled to zero."""
    out: list[str] = []
    for endpoint_id in workload_services.endpoints_to_idle():
        try:
            if workload_services.endpoint_idle(endpoint_id=endpoint_id):
                out.append(str(endpoint_id))
        except Exception:  # one broken endpoint must not stop the others' passes
            logger.exception("idle pass for endpoint %s failed", endpoint_id)
    return out


@shared_task(name=benchmarks.BENCHMARK_TASK, acks_late=False, max_retries=0)
def endpoint_benchmark_run(benchmark_id: str) -> str | None:
    """Run one queued benchmark through its endpoint's URL; its status afterwards (None if gone or claimed)."""
    benchmark = benchmarks.benchmark_run(benchmark_id=benchmark_id)
    return None if benchmark is None else benchmark.status

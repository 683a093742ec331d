"""What the quota check adds to an admission: container.create queued with and without it, side by side.

    .venv/bin/python bench/quota_admission.py
    .venv/bin/python bench/quota_admission.py --rounds 1000 --containers 2000

One workspace with a node, `--containers` active containers already on it (their usage is what the check
sums), a few live endpoints, and limits on every quota a container asks for (so every sum runs). Each
round queues the same `container.create` (the service `command_queue`, in its transaction, then rolled
back so the world stays the same) twice, in alternating order: once as shipped (the quota row locked,
usage summed in one UNION ALL, compared) and once with the lock and `admit` replaced by no-ops. Prints
the p50/p95 of each, the p95 added, a bare query's round trip for scale, and PASS/MISS against the goal
(< 2 ms added at p95). PostgreSQL must be running; the database is BENCH_DB (dropped and made afresh).
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleverthis.settings.base")
# DEBUG is off, as in production: a secret key of this run's own (the web processes it starts inherit it)
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/14")
BENCH_DB = os.environ.setdefault("BENCH_DB", "cleverthis_bench_quota")
os.environ["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{BENCH_DB}"

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402

GOAL_MS = 2.0


def prepare(containers: int) -> tuple[object, object, object]:
    """A fresh database: a user, its workspace with quotas, a cluster, an online node and its containers."""
    import psycopg
    from django.contrib.auth import get_user_model

    from agent import protocol
    from fleet import services
    from fleet.workloads.models import Container, ContainerStatus, Endpoint, EndpointStatus
    from tenancy.services import workspace_create, workspace_quota_set
    from tests.fleet.conftest import facts_dict, make_csr_pem, make_key

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DB}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{BENCH_DB}"')
    connection.close()
    call_command("migrate", verbosity=0)
    user = get_user_model().objects.create_user("bench", password="x")
    workspace = workspace_create(name="Bench", owner=user)
    cluster = services.cluster_create(actor=user, workspace=workspace, name="bench")
    _, raw = services.join_token_create(cluster=cluster, actor=user)
    facts = facts_dict("bench-node")
    node, _ = services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts)
    services.node_connected(
        node=node, facts=protocol.from_dict(protocol.HostFacts, facts, where="facts"), inventory=protocol.Inventory()
    )
    spec = {"image": "nginx", "name": "c", "cpu": 0.5, "memory_mb": 256, "gpus": 0}
    Container.objects.bulk_create(
        Container(
            node=node,
            cluster=cluster,
            name=f"c{i}",
            image="nginx",
            status=ContainerStatus.RUNNING,
            spec=spec,
            req_cpus=0.5,
            req_memory_mb=256,
        )
        for i in range(containers)
    )
    Endpoint.objects.bulk_create(
        Endpoint(cluster=cluster, node=node, model_id="m/m", status=EndpointStatus.RUNNING, min_vram_mb=1024)
        for _ in range(20)
    )
    big = 1_000_000
    workspace_quota_set(
        actor=user, workspace=workspace, limits={"containers": big, "cpu_cores": big, "memory_gib": big, "gpus": big}
    )
    node.refresh_from_db()
    return user, cluster, node


def admission_ms(user: object, cluster: object, node: object) -> float:
    """One container.create queued in its transaction, rolled back; milliseconds."""
    from fleet.services import command_queue

    payload = {"image": "nginx:1.27", "name": "bench", "cpu": 1.0, "memory_mb": 512}
    start = time.perf_counter()
    with transaction.atomic():
        command_queue(actor=user, cluster=cluster, command_type="container.create", payload=payload, node=node)
        transaction.set_rollback(True)
    return (time.perf_counter() - start) * 1000


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=600)
    parser.add_argument("--containers", type=int, default=500, help="active containers already in the workspace")
    args = parser.parse_args()

    from fleet.services import commands as command_services
    from fleet.workloads.services import containers as container_services

    user, cluster, node = prepare(args.containers)
    shipped_admit, shipped_lock = container_services.admit, command_services.locked_quota

    def measure(checked: bool) -> float:
        if not checked:  # no quota row lock (taken first by command_queue), no admit
            container_services.admit = lambda **_: None
            command_services.locked_quota = lambda *_: None
        try:
            return admission_ms(user, cluster, node)
        finally:
            container_services.admit, command_services.locked_quota = shipped_admit, shipped_lock

    for _ in range(50):  # warm-up: connections, caches, plans
        measure(True)
        measure(False)
    with_check: list[float] = []
    without: list[float] = []
    for i in range(args.rounds):
        order = (True, False) if i % 2 == 0 else (False, True)
        for checked in order:
            (with_check if checked else without).append(measure(checked))
    trips = []
    with connection.cursor() as cursor:  # what one query's round trip costs on this machine, for scale
        for _ in range(args.rounds):
            start = time.perf_counter()
            cursor.execute("SELECT 1")
            cursor.fetchall()
            trips.append((time.perf_counter() - start) * 1000)
    added_p95 = p95(with_check) - p95(without)
    added_p50 = statistics.median(with_check) - statistics.median(without)
    print(f"container.create admission, {args.rounds} rounds, {args.containers} active containers in the workspace")
    print(f"{'':22}{'p50 ms':>10}{'p95 ms':>10}")
    print(f"{'without quota check':22}{statistics.median(without):10.3f}{p95(without):10.3f}")
    print(f"{'with quota check':22}{statistics.median(with_check):10.3f}{p95(with_check):10.3f}")
    print(f"added: p50 {added_p50:.3f} ms, p95 {added_p95:.3f} ms (ratio at p95 {p95(with_check) / p95(without):.2f}x)")
    trip = f"p50 {statistics.median(trips):.3f} ms, p95 {p95(trips):.3f} ms"
    print(f"one SELECT 1 round trip: {trip} (the check is 3 queries)")
    verdict = "PASS" if added_p95 < GOAL_MS else "MISS"
    print(f"{verdict}: the quota check adds {added_p95:.3f} ms at p95 (goal < {GOAL_MS} ms)")
    connection.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

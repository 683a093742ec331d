"""`/metrics` in-process: the bearer token, the database gauges, and live gauges of dead processes.

The end-to-end scrape of a real control plane (web replicas, a Celery worker, an agent) is in
tests/e2e/test_metrics.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cleverthis import metrics_scrape
from fleet import services
from fleet.models import Node

pytestmark = pytest.mark.django_db


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of an exposition text."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_need_the_bearer_token(client, settings):
    settings.METRICS_TOKEN = "s3cret"
    missing = client.get("/metrics")
    assert missing.status_code == 401
    assert missing["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Token s3cret").status_code == 401
    good = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret")
    assert good.status_code == 200
    assert good["Content-Type"].startswith("text/plain; version=")
    assert "cleverthis_commands" in good.content.decode()


def test_metrics_are_off_without_a_token(client, settings):
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 403
    assert client.get("/metrics").status_code == 403


def test_database_gauges_count_nodes_per_status_and_commands(owner, workspace):
    from tests.fleet.conftest import facts_dict, make_csr_pem, make_key

    cluster = services.cluster_create(actor=owner, workspace=workspace, name="gauges")
    for name in ("a", "b"):
        _, raw = services.join_token_create(cluster=cluster, actor=owner)
        services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts_dict(name))
    Node.objects.filter(hostname="a").update(status="online", connected=True, cpu_percent=42.5, memory_used_mb=2)
    node_a = Node.objects.get(hostname="a")
    services.command_dispatch(
        actor=owner, cluster=cluster, command_type="model.download", payload={"model_id": "a/b"}, node=node_a
    )
    found = samples(metrics_scrape.render().decode())
    labels = (("cluster", "gauges"), ("workspace", workspace.slug))
    assert found[("cleverthis_nodes", (*labels[:1], ("status", "online"), *labels[1:]))] == 1
    assert found[("cleverthis_nodes", (*labels[:1], ("status", "offline"), *labels[1:]))] == 1
    assert found[("cleverthis_nodes", (*labels[:1], ("status", "draining"), *labels[1:]))] == 0
    assert found[("cleverthis_commands", (("status", "queued"), ("type", "model.download")))] == 1
    node_labels = (("cluster", "gauges"), ("node", node_a.name), ("node_id", str(node_a.pk)), labels[1])
    assert found[("cleverthis_node_cpu_percent", node_labels)] == 42.5
    assert found[("cleverthis_node_memory_used_bytes", node_labels)] == 2 * 1024 * 1024
    # a node that is not connected shows no utilization (its last figures would read as current)
    assert not [k for k in found if k[0] == "cleverthis_node_cpu_percent" and ("node", "b") in k[1]]


def test_live_gauges_of_a_dead_process_are_dropped_and_its_counters_kept(tmp_path):
    """A process that exited without a word (SIGKILL, OOM) leaves its files; a scrape forgets its live gauges."""
    script = (
        "import os, sys\n"
        f"os.environ['PROMETHEUS_MULTIPROC_DIR'] = {str(tmp_path)!r}\n"
        "from prometheus_client import Counter, Gauge\n"
        "Gauge('t_tunnels', 't', multiprocess_mode='liveall').inc(3)\n"
        "Counter('t_done', 't').inc(2)\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)
    assert len(list(tmp_path.glob("gauge_liveall_*.db"))) == 1
    metrics_scrape.forget_dead_processes(str(tmp_path))
    assert not list(tmp_path.glob("gauge_liveall_*.db"))
    assert len(list(tmp_path.glob("counter_*.db"))) == 1


def _load_apps(env_dir: str) -> subprocess.CompletedProcess:
    code = "import django; django.setup(); import cleverthis.metrics_scrape"
    env = {"DJANGO_SETTINGS_MODULE": "cleverthis.settings.base", "PATH": "/usr/bin:/bin"}
    env["SECRET_KEY"] = os.environ["SECRET_KEY"]  # DEBUG off: a key production would accept (the tests')
    env["PROMETHEUS_MULTIPROC_DIR"] = env_dir
    from tests.support.processes import REPO_ROOT

    return subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )


def test_a_missing_multiprocess_directory_is_made_and_used(tmp_path):
    loaded = _load_apps(str(tmp_path / "made" / "metrics"))
    assert loaded.returncode == 0, loaded.stderr
    assert list((tmp_path / "made" / "metrics").glob("*.db"))


@pytest.mark.parametrize("kind", ["a file", "under a file"])
def test_an_unusable_multiprocess_directory_is_a_clear_configuration_error(tmp_path, kind):
    afile = tmp_path / "afile"
    afile.write_text("x")
    path = {"a file": str(afile), "under a file": str(afile / "metrics")}[kind]
    loaded = _load_apps(path)
    assert loaded.returncode != 0
    last = loaded.stderr.strip().splitlines()[-1]
    assert last.startswith("django.core.exceptions.ImproperlyConfigured: PROMETHEUS_MULTIPROC_DIR"), loaded.stderr
    assert "prometheus_client" not in loaded.stderr


def _readme_metrics() -> dict[str, tuple[str, tuple[str, ...]]]:
    """{metric: (type, labels)} of the README's metrics table."""
    from tests.support.processes import REPO_ROOT

    text = (REPO_ROOT / "README.md").read_text()
    table = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`cleverthis_"):
            labels = tuple(sorted(label.strip(" `") for label in cells[2].split(",") if label.strip()))
            rows[cells[0].strip("`")] = (cells[1], labels)
    return rows


def test_the_readme_lists_exactly_the_exported_metrics_with_types_and_labels():
    from prometheus_client.metrics import MetricWrapperBase

    from kernel import metrics

    exported: dict[str, tuple[str, tuple[str, ...]]] = {}
    for instrument in vars(metrics).values():
        if isinstance(instrument, MetricWrapperBase):
            name = instrument._name + ("_total" if instrument._type == "counter" else "")
            labels = list(instrument._labelnames)
            if getattr(instrument, "_multiprocess_mode", "") in ("all", "liveall"):
                labels.append("pid")  # one series per process
            exported[name] = (instrument._type, tuple(sorted(labels)))
    for family in [*metrics_scrape.DatabaseCollector().collect(), *metrics_scrape.ReplicaLoadCollector().collect()]:
        exported[family.name] = (family.type, tuple(sorted(family._labelnames)))
    assert len(exported) >= 18
    assert _readme_metrics() == exported


def test_each_endpoint_replica_shows_its_shared_load_and_what_the_router_did(owner, workspace):
    import uuid

    from fleet import balancer, replica_load
    from fleet.replica_load import LoadPublisher
    from fleet.workloads.models import Endpoint, EndpointReplica

    cluster = services.cluster_create(actor=owner, workspace=workspace, name="routing")
    endpoint = Endpoint.objects.create(cluster=cluster, model_id="acme/tiny", routing_policy="session")
    replica = EndpointReplica.objects.create(endpoint=endpoint)
    upstream = balancer.Upstream(key=replica.server_id, node_id=uuid.uuid4(), port=8001)
    for key in (b"s1", b"s1", b"s2", b"s1"):
        lease = balancer.Lease((upstream,), balancer.SESSION, key)
        lease.take()
        lease.release()
    held = balancer.Lease((upstream,))
    held.take()
    publisher = LoadPublisher(name="test-metrics")
    try:
        publisher.publish(publisher.sample())
        found = samples(metrics_scrape.render().decode())
    finally:
        held.release()
        publisher.publish({})
        replica_load.discard()
    labels = (
        ("endpoint_id", str(endpoint.pk)),
        ("replica", replica.server_id),
        ("routing_policy", "session"),
        ("workspace", workspace.slug),
    )
    assert found[("cleverthis_endpoint_replica_requests_routed", labels)] == 5
    assert found[("cleverthis_endpoint_replica_affinity_hits", labels)] == 2  # the 2nd and 3rd "s1"
    assert found[("cleverthis_endpoint_replica_in_flight", labels)] == 1
    assert (
        0
        < found[("cleverthis_endpoint_replica_decision_seconds", tuple(sorted((*labels, ("quantile", "0.99")))))]
        <= 0.005
    )


def test_each_endpoint_queue_shows_its_depth_wait_and_refusals(owner, workspace):
    from fleet import admission, replica_load
    from fleet.replica_load import LoadPublisher
    from fleet.workloads.models import Endpoint

    cluster = services.cluster_create(actor=owner, workspace=workspace, name="queued")
    endpoint = Endpoint.objects.create(cluster=cluster, model_id="acme/tiny")
    gate = admission.gate(admission.QueuePolicy(str(endpoint.pk), limit=1, depth=10, wait_s=5.0))
    for wait in (0.0, 0.0, 0.3, 2.0):
        gate.waits.observe(wait)
    gate.refuse("queue_full")
    gate.cold = 2  # two requests waiting for a cold start
    here, other = LoadPublisher(name="test-q-here"), LoadPublisher(name="test-q-other")
    try:
        here.publish({}, queues=here.sample_queues())
        other.publish({}, queues={str(endpoint.pk): (3, (), 1)})
        found = samples(metrics_scrape.render().decode())
    finally:
        here.publish({})
        other.publish({})
        replica_load.discard()
    labels = (("endpoint_id", str(endpoint.pk)), ("workspace", workspace.slug))
    assert found[("cleverthis_endpoint_queue_depth", labels)] == 5  # 2 here, 3 in the other process
    assert found[("cleverthis_endpoint_queue_refused", labels)] == 2
    assert found[("cleverthis_endpoint_queue_wait_seconds", tuple(sorted((*labels, ("quantile", "0.5")))))] == 0.0
    assert found[("cleverthis_endpoint_queue_wait_seconds", tuple(sorted((*labels, ("quantile", "0.99")))))] == 2.5

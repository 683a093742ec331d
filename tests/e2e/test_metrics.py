"""`/metrics` of a real control plane: two web replicas and a Celery worker sharing one Prometheus
multiprocess directory, a real agent, real commands, a proxied endpoint and a Ray autoscaler pass on the
worker. Scraped from the replica that does not hold the tunnel, it still shows what every process did.
"""

from __future__ import annotations

import sys

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.authtoken.models import Token

from agent import protocol
from cleverthis.celery import app as celery_app
from fleet import services
from fleet.workloads import services as workload_services
from fleet.workloads.models import Endpoint
from raymgr import services as ray_services
from tests.e2e.conftest import node_of, wait_status
from tests.fleet.conftest import facts_dict, make_csr_pem, make_key
from tests.raymgr.conftest import start_head
from tests.support.live import ControlPlane, subprocess_env
from tests.support.processes import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TOKEN = "metrics-test-token"


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """{sample name: [(labels, value), ...]} from /metrics at `url`."""
    response = requests.get(f"{url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert response.status_code == 200, response.text
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def value(found, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(v for got, v in found.get(name, []) if labels.items() <= got.items())


@pytest.fixture
def plane(tmp_path, settings):
    settings.NODE_OFFLINE_AFTER_S = 3
    env = subprocess_env(
        NODE_OFFLINE_AFTER_S="3", METRICS_TOKEN=TOKEN, PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics")
    )
    plane = ControlPlane(log_dir=tmp_path, env=env)
    plane.start_replica()
    plane.start_replica()
    plane.start_worker()
    yield plane
    plane.stop()


def test_one_scrape_shows_every_process(plane, cluster, operator, agents):
    user, workspace = operator
    tunnel_replica, other = plane.replicas
    other_url = f"http://127.0.0.1:{plane.ports[1]}"
    assert requests.get(f"{other_url}/metrics", timeout=30).status_code == 401

    # a node on replica 0, a command through the Celery worker, an endpoint proxied from replica 1
    server = f"{sys.executable} -m tests.support.openai_standin"
    _, state, _ = agents(plane, cluster, user, "m", extra_env={"CLEVERTHIS_ENDPOINT_SERVER": server})
    node = node_of(state)
    wait_status(node, "online")
    (download,) = services.command_dispatch(
        actor=user, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}, node=node
    )
    wait_until(lambda: type(download).objects.get(pk=download.pk).status == "succeeded", timeout=60, what="download")
    endpoint = workload_services.endpoint_create(actor=user, cluster=cluster, model_id="acme/tiny")
    wait_until(lambda: Endpoint.objects.get(pk=endpoint.pk).status == "running", timeout=60, what="endpoint")
    endpoint.refresh_from_db()
    token = Token.objects.create(user=user)
    answer = requests.get(
        f"{other_url}/v1/models",
        headers={"Authorization": f"Token {token.key}", "Host": endpoint.hostname},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text

    # a running Ray cluster (on a node without an agent: its commands are answered here), and one
    # autoscaler pass run by the worker (not by this process)
    ray_compute = services.cluster_create(actor=user, workspace=workspace, name="ray-lab")
    _, raw = services.join_token_create(cluster=ray_compute, actor=user)
    facts = facts_dict("ray-head", gpus=[])
    head_node, _ = services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts)
    services.node_connected(
        node=head_node,
        facts=protocol.from_dict(protocol.HostFacts, facts, where="facts"),
        inventory=protocol.Inventory(),
    )
    ray = ray_services.ray_cluster_create(
        actor=user, workspace=workspace, compute_cluster=ray_compute, name="r", gcs_port=6380
    )
    start_head(ray)
    autoscaled = celery_app.send_task("raymgr.tasks.autoscale")
    try:
        assert autoscaled.get(timeout=60) == 1
    finally:
        autoscaled.forget()

    found = scrape(other_url)
    assert value(found, "cleverthis_nodes", workspace=workspace.slug, cluster="lab", status="online") == 1
    assert value(found, "cleverthis_nodes", workspace=workspace.slug, cluster="lab", status="offline") == 0
    # tunnels per process: the replica holding it says 1, the other 0
    tunnels = {labels["pid"]: v for labels, v in found["cleverthis_tunnels_connected"]}
    assert tunnels.get(str(tunnel_replica.popen.pid)) == 1, tunnels
    assert tunnels.get(str(other.popen.pid), 0) == 0, tunnels
    assert value(found, "cleverthis_commands", type="model.download", status="succeeded") == 1
    assert value(found, "cleverthis_command_ack_seconds_count", type="model.download") == 1
    assert value(found, "cleverthis_command_ack_seconds_count", type="endpoint.start") == 1
    assert value(found, "cleverthis_heartbeat_lag_seconds_count") >= 1
    assert value(found, "cleverthis_proxy_streams_total", via="peer") >= 1
    assert value(found, "cleverthis_proxy_streams_active") == 0
    assert value(found, "cleverthis_proxy_bytes_total", direction="to_node") > 0
    assert value(found, "cleverthis_proxy_bytes_total", direction="from_node") > len(b'"acme/tiny"')
    # usage metering's counters, added by the replica that proxied the request at its flush (USAGE_FLUSH_S)
    usage = {"workspace_id": str(workspace.pk), "endpoint_id": str(endpoint.pk)}
    wait_until(
        lambda: value(scrape(other_url), "cleverthis_endpoint_requests_total", outcome="ok", **usage) == 1,
        timeout=15,
        what="the endpoint's request counted",
    )
    assert value(found, "cleverthis_ray_clusters", workspace=workspace.slug, state="running") == 1
    assert value(found, "cleverthis_ray_autoscaler_decisions_total") == 1
    assert value(found, "cleverthis_node_cpu_percent", node_id=str(node.pk)) >= 0
    assert value(found, "cleverthis_node_memory_used_bytes", node_id=str(node.pk)) > 0
    assert 0 <= value(found, "cleverthis_node_heartbeat_age_seconds", node_id=str(node.pk)) < 30

    # the replica holding the tunnel dies without a word: its live gauge goes, its counters stay
    tunnel_replica.kill()
    tunnel_replica.popen.wait(10)
    after = scrape(other_url)
    assert str(tunnel_replica.popen.pid) not in {labels["pid"] for labels, _ in after["cleverthis_tunnels_connected"]}
    assert value(after, "cleverthis_command_ack_seconds_count", type="model.download") == 1

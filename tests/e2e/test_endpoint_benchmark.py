"""A benchmark end to end: started through the API by the workspace's Owner, run by the real Celery worker
through the endpoint's URL on the real web process (key check, routing, tunnel) to a real agent's server (the
OpenAI stand-in: it streams its answer word by word and reports usage as vLLM does), with the key made for
the run; the stored report has sane non-zero figures, the key is revoked afterwards, the requests show in the
endpoint's own count, and the endpoint's page shows the run and lets two be compared."""

from __future__ import annotations

import sys

import pytest
from rest_framework.authtoken.models import Token

from fleet import services
from fleet.models import Command
from fleet.workloads import services as workload_services
from fleet.workloads.models import Endpoint, EndpointBenchmark, EndpointReplica, EndpointStatus
from tenancy.models import ApiKey
from tests.e2e.conftest import node_of, wait_status
from tests.support.live import ControlPlane, subprocess_env
from tests.support.processes import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def control_plane(tmp_path, settings):
    """One web replica and a Celery worker that reaches it (BENCHMARK_TARGET_URL: the web replica's address)."""
    settings.NODE_OFFLINE_AFTER_S = 3
    plane = ControlPlane(
        log_dir=tmp_path, env=subprocess_env(NODE_OFFLINE_AFTER_S="3", ENDPOINT_REQUESTS_FLUSH_S="0.5")
    )
    plane.start_replica()
    plane.env["BENCHMARK_TARGET_URL"] = plane.url
    plane.start_worker()
    yield plane
    plane.stop()


def test_a_benchmark_runs_through_the_endpoint_and_stores_a_report(control_plane, cluster, operator, agents):
    import requests

    user, _ = operator
    standin = {"CLEVERTHIS_ENDPOINT_SERVER": f"{sys.executable} -m tests.support.openai_standin"}
    _, state, _ = agents(control_plane, cluster, user, "gpu-a", extra_env=standin)
    node = node_of(state)
    wait_status(node, "online")
    (download,) = services.command_dispatch(
        actor=user, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}, node=node
    )
    wait_until(lambda: Command.objects.get(pk=download.pk).status == "succeeded", timeout=60, what="download")
    endpoint = workload_services.endpoint_create(actor=user, cluster=cluster, model_id="acme/tiny")
    (replica,) = EndpointReplica.objects.filter(endpoint=endpoint)
    wait_until(
        lambda: EndpointReplica.objects.get(pk=replica.pk).status == EndpointStatus.RUNNING, timeout=60, what="running"
    )
    token = Token.objects.create(user=user)
    api = requests.Session()
    api.headers["Authorization"] = f"Token {token.key}"
    settings = {"concurrency": 3, "prompt_tokens": 12, "output_tokens": 12, "duration_s": 3, "turns": 2}

    def run_one() -> EndpointBenchmark:
        made = api.post(
            f"{control_plane.url}/api/v1/endpoint-benchmarks/",
            json={"endpoint": str(endpoint.pk), **settings},
            timeout=30,
        )
        assert made.status_code == 201, made.text
        pk = made.json()["id"]
        wait_until(lambda: not EndpointBenchmark.objects.get(pk=pk).in_progress, timeout=90, what="benchmark finished")
        return EndpointBenchmark.objects.get(pk=pk)

    run = run_one()
    assert run.status == "succeeded", (run.failure_message, run.report, control_plane.logs())
    report = run.report
    assert report["requests"] >= settings["concurrency"]
    assert report["errors"] == 0, report["errors_by_kind"]
    assert report["succeeded"] == report["requests"] == run.requests_done
    assert report["ttft_ms_p50"] > 0
    assert report["ttft_ms_p99"] >= report["ttft_ms_p50"]
    assert report["itl_ms_p50"] >= 0
    assert report["itl_ms_p99"] >= report["itl_ms_p50"]
    # the stand-in answers with its prompt's words: each answer is over 12 tokens, and a second turn resends the
    # first, so the mean prompt is longer than one turn's words
    assert report["output_tokens"] >= report["succeeded"] * 12
    assert report["prompt_tokens_mean"] > 12
    assert report["output_tokens_per_s"] > 0
    assert report["requests_per_s"] > 0
    assert 3 <= report["duration_s"] < 60
    assert sum(report["per_second"]["requests"]) == report["succeeded"]

    key = ApiKey.objects.get(name__startswith=f"benchmark {str(run.pk)[:8]}")
    assert key.revoked_at is not None  # the run's key is revoked once it ended
    assert key.endpoint_grants.get().endpoint_id == endpoint.pk
    wait_until(
        lambda: Endpoint.objects.get(pk=endpoint.pk).request_count > 0,
        timeout=15,
        what="the requests counted by the endpoint's proxy (written at most every ENDPOINT_REQUESTS_FLUSH_S)",
    )

    second = run_one()
    assert second.status == "succeeded", second.failure_message
    page = requests.Session()
    login = page.get(f"{control_plane.url}/accounts/login/", timeout=30)
    csrf = login.cookies["csrftoken"]
    page.post(
        f"{control_plane.url}/accounts/login/",
        data={"username": "ops", "password": "pw-ops", "csrfmiddlewaretoken": csrf},
        headers={"Referer": f"{control_plane.url}/accounts/login/"},
        timeout=30,
    )
    detail = page.get(f"{control_plane.url}/compute/endpoints/{endpoint.pk}/", timeout=30).text
    assert f'data-benchmark="{run.pk}"' in detail
    assert f'data-benchmark="{second.pk}"' in detail
    compared = page.get(
        f"{control_plane.url}/compute/endpoints/{endpoint.pk}/benchmarks/compare/?a={run.pk}&b={second.pk}", timeout=30
    )
    assert compared.status_code == 200
    assert 'data-figure="ttft_ms_p50"' in compared.text
    exported = api.get(f"{control_plane.url}/api/v1/endpoint-benchmarks/{run.pk}/export/?as=csv", timeout=30)
    assert exported.status_code == 200
    assert f"requests,{report['requests']}" in exported.text

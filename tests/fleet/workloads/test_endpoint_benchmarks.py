"""Endpoint benchmarks without a load: who may start one (Owner/Admin; Members and Viewers 403, other
workspaces 404), bad settings → 400 with field messages (API and the page's form), 409 for an endpoint that is
not running and while a run is under way; the stored row carries the endpoint's revision and policy and its
task is enqueued on commit; the report's figures from outcomes; the CSV/JSON exports and the compare page.
The run itself, through a real agent, is tests/e2e/test_endpoint_benchmark.py."""

from __future__ import annotations

import csv
import io

import pytest

from agent import protocol
from audit.models import AuditEntry
from fleet.workloads import loadgen
from fleet.workloads import services as workloads
from fleet.workloads.models import BenchmarkStatus, EndpointBenchmark, EndpointReplica, EndpointStatus
from fleet.workloads.services import benchmarks
from tests.fleet import agent_side

pytestmark = pytest.mark.django_db

TINY = protocol.CachedModel(model_id="acme/tiny", revision="main", path="/cache/main", size_bytes=5)
GOOD = {"concurrency": 2, "prompt_tokens": 16, "output_tokens": 8, "duration_s": 5, "turns": 2}


@pytest.fixture
def running(cluster, register_node, owner):
    node = register_node(cluster, "a")
    agent_side.inventory(node, models=[TINY])
    endpoint = workloads.endpoint_create(actor=owner, cluster=cluster, model_id="acme/tiny", routing_policy="session")
    (replica,) = EndpointReplica.objects.filter(endpoint=endpoint)
    agent_side.result(replica.start_command, port=8001)
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.RUNNING
    return endpoint


@pytest.fixture
def sent(monkeypatch):
    """The benchmark tasks enqueued (by name and id), instead of a broker: sent once their transaction commits
    (a test wraps the request in `django_capture_on_commit_callbacks(execute=True)`)."""
    calls: list[tuple] = []
    monkeypatch.setattr(benchmarks.enqueue, "send", lambda name, *args, **kw: calls.append((name, *args)))
    return calls


def test_an_owner_starts_one_and_its_task_is_enqueued_on_commit(
    running, owner, api_client_for, sent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        answer = api_client_for(owner).post(
            "/api/v1/endpoint-benchmarks/", {"endpoint": str(running.pk), **GOOD}, format="json"
        )
    assert answer.status_code == 201, answer.content
    body = answer.json()
    assert body["status"] == "queued"
    assert (body["routing_policy"], body["revision"], body["turns"]) == ("session", "main", 2)
    assert sent == [(benchmarks.BENCHMARK_TASK, body["id"])]
    assert AuditEntry.objects.filter(action="endpoint.benchmark", outcome="ok").count() == 1
    again = api_client_for(owner).post(
        "/api/v1/endpoint-benchmarks/", {"endpoint": str(running.pk), **GOOD}, format="json"
    )
    assert again.status_code == 409, again.content  # one run at a time per endpoint
    listed = api_client_for(owner).get(f"/api/v1/endpoint-benchmarks/?endpoint={running.pk}").json()
    assert [row["id"] for row in listed["results"]] == [body["id"]]


@pytest.mark.parametrize("role", ["member", "viewer"])
def test_members_and_viewers_are_refused_on_the_api_and_the_page(
    running, workspace, member_of, api_client_for, client, role, sent
):
    user = member_of(workspace, role)
    answer = api_client_for(user).post(
        "/api/v1/endpoint-benchmarks/", {"endpoint": str(running.pk), **GOOD}, format="json"
    )
    assert answer.status_code == 403, answer.content
    bad = api_client_for(user).post(
        "/api/v1/endpoint-benchmarks/", {"endpoint": str(running.pk), "concurrency": 0}, format="json"
    )
    assert bad.status_code == 403  # refused before the settings are read
    client.force_login(user)
    page = client.get(f"/compute/endpoints/{running.pk}/").content.decode()
    assert "No benchmarks yet." in page  # they read reports
    assert 'id="benchmark-form"' not in page
    assert client.post(f"/compute/endpoints/{running.pk}/benchmarks/new/", GOOD).status_code == 403
    assert not EndpointBenchmark.objects.exists()
    assert sent == []


def test_another_workspace_sees_no_such_endpoint(running, other_workspace, api_client_for, sent):
    stranger = other_workspace.memberships.get().user
    answer = api_client_for(stranger).post(
        "/api/v1/endpoint-benchmarks/", {"endpoint": str(running.pk), **GOOD}, format="json"
    )
    assert answer.status_code == 404


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": 257}, "concurrency"),
        ({"prompt_tokens": "many"}, "prompt_tokens"),
        ({"output_tokens": -1}, "output_tokens"),
        ({"duration_s": 100_000}, "duration_s"),
        ({"turns": 0}, "turns"),
        ({"endpoint": "not-a-uuid"}, "endpoint"),
    ],
)
def test_bad_settings_are_400_with_the_field(running, owner, api_client_for, change, field, sent):
    answer = api_client_for(owner).post(
        "/api/v1/endpoint-benchmarks/", {"endpoint": str(running.pk), **GOOD, **change}, format="json"
    )
    assert answer.status_code == 400, answer.content
    assert field in answer.json()
    assert not EndpointBenchmark.objects.exists()


def test_the_service_refuses_bad_settings_too(running, owner):
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as refused:
        benchmarks.benchmark_create(actor=owner, endpoint=running, **{**GOOD, "concurrency": True})
    assert "concurrency" in refused.value.message_dict


def test_a_stopped_endpoint_cannot_be_benchmarked(running, owner, api_client_for, sent):
    running.status = EndpointStatus.STOPPED
    running.save(update_fields=["status"])
    answer = api_client_for(owner).post(
        "/api/v1/endpoint-benchmarks/", {"endpoint": str(running.pk), **GOOD}, format="json"
    )
    assert answer.status_code == 409, answer.content
    assert "running" in answer.json()["detail"]


def test_the_page_form_starts_one_and_shows_bad_settings(
    running, owner, client, sent, django_capture_on_commit_callbacks
):
    client.force_login(owner)
    page = client.get(f"/compute/endpoints/{running.pk}/").content.decode()
    assert 'id="benchmark-form"' in page
    assert '<section class="card" id="benchmarks">' in page  # nothing under way: not polled
    bad = client.post(
        f"/compute/endpoints/{running.pk}/benchmarks/new/", {**GOOD, "duration_s": 0}, HTTP_HX_REQUEST="true"
    )
    assert bad.status_code == 400
    assert "greater than or equal to 1" in bad.content.decode()
    assert not EndpointBenchmark.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):
        done = client.post(f"/compute/endpoints/{running.pk}/benchmarks/new/", GOOD, HTTP_HX_REQUEST="true")
    assert done.status_code == 200
    run = EndpointBenchmark.objects.get()
    assert f'data-benchmark="{run.pk}"' in done.content.decode()
    assert 'hx-trigger="every 2s"' in done.content.decode()  # polled while it is queued or running
    assert len(sent) == 1
    run.status = BenchmarkStatus.SUCCEEDED
    run.save(update_fields=["status"])
    stopped = client.get(f"/compute/endpoints/{running.pk}/benchmarks/", HTTP_HX_REQUEST="true")
    assert stopped.status_code == 286  # polling stops once nothing is under way


def outcome(started: float, ttft: float, gaps: list[float], tokens: int, **kw) -> loadgen.Outcome:
    return loadgen.Outcome(
        started=started,
        conversation=0,
        turn=0,
        status=200,
        ttft=ttft,
        latency=ttft + sum(gaps),
        itls=gaps,
        prompt_tokens=10,
        output_tokens=tokens,
        **kw,
    )


def test_the_report_from_outcomes():
    outcomes = [
        outcome(0.0, 0.1, [0.01, 0.03], 3),
        outcome(1.2, 0.3, [0.02, 0.02], 3),
        loadgen.Outcome(started=1.0, conversation=1, turn=0, status=429, retry_after="2", error="HTTP 429: busy"),
        loadgen.Outcome(started=1.2, conversation=2, turn=0, error="ReadTimeout: slow"),
    ]
    report = loadgen.summarise(outcomes, 2.0)
    assert (report["requests"], report["succeeded"], report["errors"]) == (4, 2, 2)
    assert report["errors_by_kind"] == {"HTTP 429": 1, "ReadTimeout": 1}
    assert (report["rate_limited"], report["rate_limited_with_retry_after"]) == (1, 1)
    assert report["ttft_ms_p50"] == 100.0
    assert report["ttft_ms_p99"] == 100.0  # nearest rank below, of two
    assert report["itl_ms_p50"] == 20.0
    assert report["itl_ms_p99"] == 20.0
    assert report["output_tokens"] == 6
    assert report["output_tokens_per_s"] == 3.0
    assert report["requests_per_s"] == 1.0
    assert report["per_second"]["requests"] == [1, 1]
    assert report["per_second"]["output_tokens"] == [3, 3]


def _finished(endpoint, owner, tokens_per_s: float) -> EndpointBenchmark:
    report = loadgen.summarise([outcome(0.0, 0.1, [0.01], 2)], 1.0) | {"output_tokens_per_s": tokens_per_s}
    return EndpointBenchmark.objects.create(
        endpoint=endpoint,
        status=BenchmarkStatus.SUCCEEDED,
        created_by=owner,
        revision="main",
        routing_policy="least_load",
        report=report,
        **GOOD,
    )


def test_exports_and_the_compare_page(running, owner, workspace, member_of, api_client_for, client):
    first, second = _finished(running, owner, 10.0), _finished(running, owner, 15.0)
    viewer = member_of(workspace, "viewer")
    api = api_client_for(viewer)  # any member reads reports
    as_json = api.get(f"/api/v1/endpoint-benchmarks/{first.pk}/export/?as=json")
    assert as_json.status_code == 200
    assert "attachment" in as_json["Content-Disposition"]
    import json

    assert json.loads(as_json.content)["report"]["output_tokens_per_s"] == 10.0
    as_csv = api.get(f"/api/v1/endpoint-benchmarks/{first.pk}/export/?as=csv")
    rows = list(csv.reader(io.StringIO(as_csv.content.decode())))
    assert ["output_tokens_per_s", "10.0"] in rows
    assert ["ttft_ms_p50", "100.0"] in rows
    assert api.get(f"/api/v1/endpoint-benchmarks/{first.pk}/export/?as=xml").status_code == 400
    client.force_login(viewer)
    page_csv = client.get(f"/compute/endpoints/{running.pk}/benchmarks/{first.pk}/export.csv")
    assert page_csv.status_code == 200
    assert page_csv["Content-Type"].startswith("text/csv")
    compared = client.get(f"/compute/endpoints/{running.pk}/benchmarks/compare/?a={first.pk}&b={second.pk}")
    assert compared.status_code == 200
    html = compared.content.decode()
    assert "1.50x" in html  # tokens/s, second over first
    assert 'id="benchmark-chart-output_tokens"' in html
    assert client.get(f"/compute/endpoints/{running.pk}/benchmarks/compare/?a={first.pk}").status_code == 400
    detail = client.get(f"/compute/endpoints/{running.pk}/benchmarks/{first.pk}/")
    assert detail.status_code == 200
    assert "Compare with" in detail.content.decode()


def test_a_run_whose_worker_was_lost_blocks_no_new_one(running, owner, sent):
    from datetime import timedelta

    from django.utils import timezone

    lost = EndpointBenchmark.objects.create(
        endpoint=running,
        status=BenchmarkStatus.RUNNING,
        created_by=owner,
        revision="main",
        routing_policy="least_load",
        started_at=timezone.now() - timedelta(minutes=30),
        **GOOD,
    )
    fresh = benchmarks.benchmark_create(actor=owner, endpoint=running, **GOOD)
    lost.refresh_from_db()
    assert lost.status == BenchmarkStatus.FAILED
    assert "lost" in lost.failure_message
    assert fresh.status == BenchmarkStatus.QUEUED


def test_a_plain_form_post_returns_to_the_endpoint_page(running, owner, client, sent):
    client.force_login(owner)
    done = client.post(f"/compute/endpoints/{running.pk}/benchmarks/new/", GOOD)
    assert done.status_code == 302
    assert done["Location"] == f"/compute/endpoints/{running.pk}/"
    assert EndpointBenchmark.objects.filter(endpoint=running, status=BenchmarkStatus.QUEUED).count() == 1

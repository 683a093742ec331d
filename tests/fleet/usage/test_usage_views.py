"""The usage API, the Usage page and its CSV export: the caller's workspaces only, filters, clear errors."""

from __future__ import annotations

import csv
import io
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from fleet.usage import services
from fleet.usage.models import UsageRollup
from fleet.usage.services import Rollup
from fleet.workloads.models import Endpoint, EndpointStatus
from tenancy.models import ApiKey

pytestmark = pytest.mark.django_db


def _now_minute() -> datetime:
    return datetime.now(UTC).replace(second=0, microsecond=0)


@pytest.fixture
def endpoint(cluster):
    return Endpoint.objects.create(cluster=cluster, model_id="org/m", status=EndpointStatus.RUNNING, port=8123)


@pytest.fixture
def recorded(workspace, other_workspace, cluster, endpoint):
    """Usage of this hour in the owner's workspace (an endpoint with and without a key, a cluster) and in
    another workspace."""
    minute = _now_minute()
    hour = minute.replace(minute=0)
    rows = []
    for granularity, start in (("minute", minute), ("hour", hour)):
        rows += [
            Rollup(granularity, start, workspace.pk, "endpoint", endpoint.pk, None, 10, 1, 100, 200, 5000.0, 900.0),
            Rollup(granularity, start, workspace.pk, "endpoint", endpoint.pk, 7, 4, 0, 40, 80, 400.0, 200.0),
            Rollup(granularity, start, workspace.pk, "cluster", cluster.pk, node_seconds=7200, gpu_seconds=3600),
            Rollup(granularity, start, other_workspace.pk, "endpoint", uuid.uuid4(), None, 1000, 0, 5, 5),
        ]
    services.usage_add(rows=rows)
    return minute


def test_the_api_reports_the_callers_usage_only(api_client_for, owner, recorded, endpoint, cluster):
    response = api_client_for(owner).get("/api/v1/usage/?period=1h")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["granularity"] == "minute"
    assert len(body["series"]) == 60
    totals = body["totals"]
    assert (totals["requests"], totals["errors"]) == (14, 1)
    assert (totals["prompt_tokens"], totals["completion_tokens"]) == (140, 280)
    assert totals["latency_ms_mean"] == pytest.approx(5400 / 14)
    assert (totals["node_hours"], totals["gpu_hours"]) == (2.0, 1.0)
    assert body["series"][-1]["requests"] == 14  # this minute, the last bucket
    by = {(s["subject_kind"], s["api_key_id"]): s for s in body["subjects"]}
    assert set(by) == {("endpoint", None), ("endpoint", 7), ("cluster", None)}
    assert by[("endpoint", 7)]["completion_tokens"] == 80
    assert by[("endpoint", None)]["name"] == f"endpoint-{endpoint.slug} (org/m)"
    assert by[("cluster", None)]["name"] == cluster.name


def test_the_api_filters_by_key_and_endpoint_and_uses_hours_for_long_periods(api_client_for, owner, recorded, endpoint):
    client = api_client_for(owner)
    by_key = client.get("/api/v1/usage/?period=24h&api_key=7").json()
    assert by_key["granularity"] == "hour"
    assert len(by_key["series"]) == 24
    assert (by_key["totals"]["requests"], by_key["totals"]["node_hours"]) == (4, 0)  # endpoint rows only
    by_endpoint = client.get(f"/api/v1/usage?period=7d&endpoint={endpoint.pk}").json()
    assert by_endpoint["totals"]["requests"] == 14


def test_the_api_refuses_bad_filters_with_field_messages(api_client_for, owner, other_workspace, recorded):
    client = api_client_for(owner)
    response = client.get(f"/api/v1/usage/?period=2y&api_key=0&workspace={other_workspace.pk}&endpoint=x")
    assert response.status_code == 400
    assert set(response.json()) == {"period", "api_key", "workspace", "endpoint"}
    assert response.json()["workspace"] == ["No such workspace."]  # another workspace's: as if none existed


def test_a_viewer_sees_usage_and_anonymous_callers_do_not(api_client_for, member_of, workspace, recorded, client):
    viewer = member_of(workspace, "viewer")
    assert api_client_for(viewer).get("/api/v1/usage/?period=1h").json()["totals"]["requests"] == 14
    assert client.get("/api/v1/usage/").status_code in (401, 403)
    assert client.get("/usage/").status_code == 302  # to sign in


def test_the_usage_page_shows_totals_charts_and_rows(client, owner, recorded, endpoint):
    client.force_login(owner)
    page = client.get("/usage/?period=1h")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'data-total="requests">14<' in html
    assert 'data-total="completion_tokens">280<' in html
    assert 'data-total="gpu_hours">1.00<' in html
    assert html.count('data-chart="') == 3
    assert f"endpoint-{endpoint.slug} (org/m)" in html
    assert 'href="/usage/"' in html  # in the navigation
    partial = client.get("/usage/?period=1h", headers={"HX-Request": "true"})
    assert partial.content.decode().lstrip().startswith('<section id="usage-report"')
    bad = client.get("/usage/?period=forever")
    assert bad.status_code == 400
    assert "period:" in bad.content.decode()


def test_the_usage_page_filters_by_key_name(client, owner, workspace, other_workspace, recorded, endpoint):
    """The key filter is a list of the workspaces' keys by name (it was a numeric id no page shows)."""
    key = ApiKey.objects.create(user=owner, workspace=workspace, name="ci-bot", prefix="cibot123", secret_hash="a" * 64)
    theirs = other_workspace.memberships.get(role="owner").user
    ApiKey.objects.create(
        user=theirs, workspace=other_workspace, name="their-key", prefix="theirs12", secret_hash="b" * 64
    )
    minute = _now_minute()
    services.usage_add(rows=[Rollup("minute", minute, workspace.pk, "endpoint", endpoint.pk, key.pk, 5, 0, 50, 60)])
    client.force_login(owner)
    html = client.get("/usage/?period=1h").content.decode()
    assert "API key id" not in html
    assert 'type="number" min="1" name="api_key"' not in html
    picker = re.search(r'<select name="api_key">(.*?)</select>', html, re.S)
    assert picker, "no key list on the Usage page"
    assert f'<option value="{key.pk}" >ci-bot (ctk_cibot123_…)</option>' in picker[1]
    assert "their-key" not in picker[1]  # another workspace's key
    chosen = client.get(f"/usage/?period=1h&api_key={key.pk}").content.decode()
    assert 'data-total="requests">5<' in chosen
    assert f'<option value="{key.pk}" selected>ci-bot' in chosen


def test_the_csv_export_has_every_rollup_of_the_period(client, owner, recorded, endpoint, cluster):
    client.force_login(owner)
    response = client.get("/usage/export.csv?period=1h")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    lines = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert len(lines) == 3  # the minute rows of the owner's workspace
    keyed = next(r for r in lines if r["api_key_id"] == "7")
    assert (keyed["subject_id"], keyed["requests"], keyed["prompt_tokens"]) == (str(endpoint.pk), "4", "40")
    assert datetime.fromisoformat(keyed["bucket_start"]) == recorded
    assert next(r for r in lines if r["subject_kind"] == "cluster")["node_seconds"] == "7200"
    assert client.get("/usage/export.csv?api_key=-1").status_code == 400


def test_the_series_of_a_period_has_every_bucket_even_empty_ones(api_client_for, owner, workspace, endpoint):
    start = _now_minute() - timedelta(minutes=5)
    services.usage_add(rows=[Rollup("minute", start, workspace.pk, "endpoint", endpoint.pk, requests=3)])
    series = api_client_for(owner).get("/api/v1/usage/?period=1h").json()["series"]
    assert [b["requests"] for b in series[-6:]] == [3, 0, 0, 0, 0, 0]


def test_the_report_costs_the_same_queries_however_much_was_recorded(
    api_client_for, owner, workspace, cluster, endpoint, django_assert_num_queries
):
    client = api_client_for(owner)
    minute = _now_minute()

    def record(n: int) -> None:
        rows = [
            Rollup("minute", minute - timedelta(minutes=i), workspace.pk, "endpoint", endpoint.pk, i, 1)
            for i in range(n)
        ]
        rows += [
            Rollup("minute", minute - timedelta(minutes=i), workspace.pk, "cluster", cluster.pk, node_seconds=60)
            for i in range(n)
        ]
        services.usage_add(rows=rows)

    record(2)
    # totals, series, sums per subject, the names of its endpoints and of its clusters, the price table and
    # the rows costed
    with django_assert_num_queries(8) as few:
        assert client.get("/api/v1/usage/?period=1h").status_code == 200
    UsageRollup.objects.all().delete()
    record(50)
    with django_assert_num_queries(len(few.captured_queries)):
        assert client.get("/api/v1/usage/?period=1h").status_code == 200

"""Prices: versioned price table, usage costed at the prices then in force (Usage page, API, CSV), monthly
chargeback statements (page, CSV), and the minute's sampling of CPU core-, GiB- and per-model GPU-seconds."""

from __future__ import annotations

import csv
import io
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.test import Client

from fleet.models import Node, NodeStatus
from fleet.usage import chargeback, services
from fleet.usage.models import PriceVersion, UsageRollup

pytestmark = pytest.mark.django_db

NOV = datetime(2026, 11, 1, tzinfo=UTC)
H100 = "NVIDIA H100"


@pytest.fixture
def operator(make_user):
    user = make_user("operator")
    user.is_staff = True
    user.save()
    return user


def prices(operator, effective_from, **rates):
    return services.price_version_create(
        actor=operator, effective_from=effective_from, now=effective_from - timedelta(days=1), **rates
    )


def hour_row(workspace, subject_id, at, *, kind="cluster", key=None, **counters):
    return UsageRollup.objects.create(
        granularity="hour",
        bucket_start=at,
        workspace=workspace,
        subject_kind=kind,
        subject_id=subject_id,
        api_key_id=key,
        **counters,
    )


@pytest.fixture
def november(operator, workspace, cluster):
    """A price change on the 15th; usage on the 10th and the 20th (and some in October, before any price)."""
    prices(
        operator,
        NOV,
        node_hour="1.00",
        gpu_hour="0.50",
        gpu_model_hour={H100: "2.00"},
        cpu_core_hour="0.01",
        memory_gib_hour="0.001",
        prompt_per_million="0.50",
        completion_per_million="1.50",
    )
    prices(
        operator,
        NOV + timedelta(days=14),
        node_hour="3.00",
        gpu_hour="0.50",
        gpu_model_hour={H100: "4.00"},
        cpu_core_hour="0.01",
        memory_gib_hour="0.001",
        prompt_per_million="1.00",
        completion_per_million="2.00",
        endpoint_tokens={},
    )
    endpoint = uuid.uuid4()
    for day, hours in ((10, 10), (20, 5)):
        for h in range(hours):
            at = NOV.replace(day=day, hour=h)
            hour_row(
                workspace,
                cluster.pk,
                at,
                node_seconds=3600,
                gpu_seconds=7200,
                gpu_seconds_by_model={H100: 7200},
                cpu_core_seconds=16 * 3600,
                memory_mib_seconds=64 * 1024 * 3600,
            )
        hour_row(
            workspace,
            endpoint,
            NOV.replace(day=day),
            kind="endpoint",
            key=None,
            requests=10,
            prompt_tokens=2_000_000,
            completion_tokens=1_000_000,
        )
    hour_row(workspace, cluster.pk, datetime(2026, 10, 31, 23, tzinfo=UTC), node_seconds=3600)
    return endpoint


def test_a_price_change_mid_month_is_costed_at_the_prices_then_in_force(workspace, cluster, november):
    statement = chargeback.chargeback_statement(workspace=workspace, month=NOV.date())
    lines = {
        (line.item, line.prices_from.day): (line.quantity, line.unit_price, line.amount) for line in statement.lines
    }
    assert lines[("Node-hours", 1)] == (Decimal(10), Decimal("1.00"), Decimal("10.000000"))
    assert lines[("Node-hours", 15)] == (Decimal(5), Decimal("3.00"), Decimal("15.000000"))
    assert lines[(f"GPU-hours ({H100})", 1)] == (Decimal(20), Decimal("2.00"), Decimal("40.000000"))
    assert lines[(f"GPU-hours ({H100})", 15)] == (Decimal(10), Decimal("4.00"), Decimal("40.000000"))
    assert lines[("CPU core-hours", 1)][2] == Decimal("1.600000")  # 160 core-hours at 0.01
    assert lines[("Memory GiB-hours", 15)][2] == Decimal("0.320000")  # 320 GiB-hours at 0.001
    assert lines[("Prompt tokens", 1)] == (Decimal(2), Decimal("0.50"), Decimal("1.000000"))
    assert lines[("Prompt tokens", 15)] == (Decimal(2), Decimal("1.00"), Decimal("2.000000"))
    assert lines[("Completion tokens", 15)] == (Decimal(1), Decimal("2.00"), Decimal("2.000000"))
    by_hand = 10 + 15 + 40 + 40 + Decimal("1.6") + Decimal("0.8") + Decimal("0.64") + Decimal("0.32")
    by_hand += Decimal("1.0") + Decimal("1.5") + Decimal("2.0") + Decimal("2.0")
    assert statement.total == by_hand
    assert statement.currency == "USD"
    assert not statement.unpriced  # October's row is not in November's statement
    october = chargeback.chargeback_statement(workspace=workspace, month=datetime(2026, 10, 1).date())
    assert (october.total, october.unpriced, october.lines) == (Decimal(0), True, [])


def test_the_statement_page_and_csv(owner, workspace, cluster, november, other_workspace):
    browser = Client()
    browser.force_login(owner)
    page = browser.get("/usage/chargeback/", {"workspace": str(workspace.pk), "month": "2026-11"})
    assert page.status_code == 200
    html = page.content.decode()
    assert "Node-hours" in html
    assert "114.86 USD" in html
    response = browser.get("/usage/chargeback.csv", {"workspace": str(workspace.pk), "month": "2026-11"})
    assert response.status_code == 200
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert rows[-1]["item"] == "Total"
    assert Decimal(rows[-1]["amount"]) == Decimal("114.86")
    node = [r for r in rows if r["item"] == "Node-hours"]
    assert [(r["unit_price"], r["amount"], r["prices_from"][:10]) for r in node] == [
        ("1.000000", "10.000000", "2026-11-01"),
        ("3.000000", "15.000000", "2026-11-15"),
    ]
    assert browser.get("/usage/chargeback/", {"workspace": str(other_workspace.pk)}).status_code == 400
    assert browser.get("/usage/chargeback/", {"month": "November"}).status_code == 400


def test_cost_beside_usage_in_the_api_page_and_csv(api_client_for, owner, operator, workspace, cluster):
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    services.price_version_create(
        actor=operator,
        effective_from=now - timedelta(hours=5),
        now=now - timedelta(days=1),
        node_hour="2.00",
        cpu_core_hour="0.10",
    )
    services.price_version_create(
        actor=operator, effective_from=now - timedelta(hours=2), now=now - timedelta(days=1), node_hour="4.00"
    )
    for ago in (8, 4, 1):  # 8 h ago: before any price
        hour_row(workspace, cluster.pk, now - timedelta(hours=ago), node_seconds=3600, cpu_core_seconds=7200)
    report = api_client_for(owner).get("/api/v1/usage/", {"period": "24h"}).json()
    assert report["currency"] == "USD"
    assert report["unpriced"] is True
    assert Decimal(report["totals"]["cost"]) == Decimal("2.00") + Decimal("0.20") + Decimal("4.00")
    assert report["totals"]["cpu_core_hours"] == 6.0
    (subject,) = report["subjects"]
    assert Decimal(subject["cost"]) == Decimal("6.20")
    costs = {b["bucket_start"]: Decimal(b["cost"]) for b in report["series"] if Decimal(b["cost"])}
    assert sorted(costs.values()) == [Decimal("2.20"), Decimal("4.00")]
    browser = Client()
    browser.force_login(owner)
    assert "6.20 USD" in browser.get("/usage/", {"period": "24h"}).content.decode()
    rows = list(csv.DictReader(io.StringIO(b"".join(browser.get("/usage/export.csv", {"period": "24h"})).decode())))
    assert sorted(r["cost"] for r in rows) == ["", "2.200000", "4.000000"]


def test_only_staff_set_prices_on_whole_hours_never_in_the_past(api_client_for, owner, operator):
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    body = {"effective_from": hour.isoformat(), "node_hour": "1.25", "gpu_model_hour": {H100: "2.5"}}
    assert api_client_for(owner).post("/api/v1/prices/", body, format="json").status_code == 403
    staff = api_client_for(operator)
    created = staff.post("/api/v1/prices/", body, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["node_hour"] == "1.250000"
    for bad, field in (
        ({"effective_from": (hour + timedelta(minutes=30)).isoformat()}, "effective_from"),
        ({"effective_from": (hour - timedelta(days=2)).isoformat()}, "effective_from"),
        ({"effective_from": hour.isoformat()}, "effective_from"),  # a version from then exists
        ({"effective_from": (hour + timedelta(hours=1)).isoformat(), "gpu_model_hour": {H100: "-1"}}, "gpu_model_hour"),
        ({"effective_from": (hour + timedelta(hours=1)).isoformat(), "node_hour": "-1"}, "node_hour"),
    ):
        response = staff.post("/api/v1/prices/", bad, format="json")
        assert response.status_code == 400, (bad, response.content)
        assert field in response.json()
    assert [v["node_hour"] for v in api_client_for(owner).get("/api/v1/prices/").json()] == ["1.250000"]
    assert PriceVersion.objects.count() == 1


def test_sampling_keeps_cpu_core_memory_and_per_model_gpu_seconds(cluster):
    now = datetime(2026, 12, 5, 10, 7, 20, tzinfo=UTC)
    for name, gpus, model in (("a", 2, H100), ("b", 1, "NVIDIA L4"), ("c", 1, H100)):
        Node.objects.create(
            cluster=cluster,
            name=name,
            hostname=name,
            status=NodeStatus.ONLINE,
            connected=True,
            gpu_count=gpus,
            gpu_model=model,
            cpu_count=8,
            memory_total_mb=32768,
            last_heartbeat_at=now - timedelta(seconds=5),
        )
    services.usage_sample(now=now)
    services.usage_sample(now=now + timedelta(minutes=1))
    hour = UsageRollup.objects.get(subject_id=cluster.pk, granularity="hour")
    assert hour.gpu_seconds_by_model == {H100: 2 * 60 * 3, "NVIDIA L4": 2 * 60}
    assert (hour.cpu_core_seconds, hour.memory_mib_seconds) == (2 * 60 * 24, 2 * 60 * 3 * 32768)
    assert hour.gpu_seconds == sum(hour.gpu_seconds_by_model.values())


def test_the_admin_adds_a_version_and_refuses_a_past_one_with_a_field_error(operator):
    operator.is_superuser = True
    operator.save()
    admin = Client()
    admin.force_login(operator)
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    form = {
        "effective_from_0": (hour + timedelta(hours=1)).strftime("%Y-%m-%d"),
        "effective_from_1": (hour + timedelta(hours=1)).strftime("%H:%M:%S"),
        "currency": "EUR",
        "node_hour": "1.5",
        "cluster_node_hour": "{}",
        "gpu_hour": "0",
        "gpu_model_hour": '{"NVIDIA H100": "3"}',
        "cpu_core_hour": "0",
        "memory_gib_hour": "0",
        "prompt_per_million": "0",
        "completion_per_million": "0",
        "endpoint_tokens": "{}",
        "note": "",
    }
    past = {**form, "effective_from_0": (hour - timedelta(days=1)).strftime("%Y-%m-%d")}
    refused = admin.post("/admin/fleet/priceversion/add/", past)
    assert refused.status_code == 200
    assert "A past period keeps its prices" in refused.content.decode()
    assert admin.post("/admin/fleet/priceversion/add/", form).status_code == 302
    version = PriceVersion.objects.get()
    assert (version.currency, version.node_hour, version.created_by) == ("EUR", Decimal("1.5"), operator)

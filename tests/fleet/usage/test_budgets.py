"""Budgets per workspace and per API key: the month's spend from the rollups, alerts at 80 % and 100 % (audit
log, webhook, the Usage page's banner) once each a month, hard stops published for every web process."""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import redis
from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.test import Client

from audit.models import AuditEntry
from fleet import enqueue
from fleet.usage import budget_stops, budgets, services, tasks
from fleet.usage.models import Budget, UsageRollup
from fleet.workloads import services as workload_services
from kernel import outbound_urls

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 6, 10, 30, tzinfo=UTC)


@pytest.fixture(autouse=True)
def clean_stops():
    budget_stops.forget()
    yield
    redis.Redis.from_url(settings.REDIS_URL).delete(budget_stops.KEY)
    budget_stops.forget()


@pytest.fixture
def sent(monkeypatch):
    calls: list[tuple] = []
    monkeypatch.setattr(enqueue, "send", lambda name, *args, countdown=None: calls.append((name, *args)))
    return calls


def use(workspace, key_id, tokens, at=NOW):
    UsageRollup.objects.create(
        granularity="hour",
        bucket_start=at.replace(minute=0),
        workspace=workspace,
        subject_kind="endpoint",
        subject_id=workspace.pk,
        api_key_id=key_id,
        requests=1,
        prompt_tokens=tokens,
    )


def stopped(workspace_id, key_id):
    budget_stops.forget()
    return asyncio.run(budget_stops.stopped(workspace_id, key_id))


def test_only_owners_set_budgets_and_a_limit_is_needed(owner, workspace, member_of):
    member = member_of(workspace, "admin")
    with pytest.raises(PermissionDenied):
        budgets.budget_set(actor=member, workspace=workspace, token_limit=10)
    with pytest.raises(ValidationError) as refused:
        budgets.budget_set(actor=owner, workspace=workspace)
    assert "token_limit" in refused.value.message_dict
    with pytest.raises(ValidationError) as refused:
        budgets.budget_set(actor=owner, workspace=workspace, money_limit=Decimal("-1"))
    assert "money_limit" in refused.value.message_dict


def test_alerts_at_80_and_100_percent_once_each_and_the_hard_stop(
    owner, workspace, sent, django_capture_on_commit_callbacks
):
    key, _ = workload_services.api_key_create(actor=owner, workspace=workspace, name="k", scopes=["invoke"])
    budgets.budget_set(
        actor=owner,
        workspace=workspace,
        api_key=key,
        token_limit=1000,
        hard_stop=True,
        webhook_url="https://h.example/b",
    )
    use(workspace, key.pk, 700)
    use(workspace, None, 5000)  # other callers' tokens are not the key's
    with django_capture_on_commit_callbacks(execute=True):
        assert budgets.budgets_evaluate(now=NOW) == 0
    assert Budget.objects.get().level == "ok"
    use(workspace, key.pk, 100, at=NOW - timedelta(hours=1))
    with django_capture_on_commit_callbacks(execute=True):
        budgets.budgets_evaluate(now=NOW)
        budgets.budgets_evaluate(now=NOW + timedelta(minutes=1))  # still 80 %: no second alert
    assert [(c[0], c[2]["threshold_percent"]) for c in sent] == [("fleet.usage.tasks.budget_webhook", 80)]
    assert sent[0][1] == "https://h.example/b"
    assert stopped(workspace.pk, key.pk) is None
    use(workspace, key.pk, 200, at=NOW - timedelta(hours=2))
    with django_capture_on_commit_callbacks(execute=True):
        assert budgets.budgets_evaluate(now=NOW) == 1
    budget = Budget.objects.get()
    assert (budget.level, budget.spent_tokens, budget.month) == ("exceeded", 1000, "2026-12")
    assert [c[2]["threshold_percent"] for c in sent] == [80, 100]
    alerts = AuditEntry.objects.filter(action="budget.alert").order_by("created_at")
    assert [a.detail["threshold_percent"] for a in alerts] == [80, 100]
    reason = stopped(workspace.pk, key.pk)
    assert reason["type"] == "budget_exceeded"
    assert reason["budget"] == f"the monthly budget of API key {key.pk}"
    assert stopped(workspace.pk, None) is None  # the key's budget stops the key only
    # a new month starts afresh: the stop lifts
    assert budgets.budgets_evaluate(now=datetime(2027, 1, 1, 0, 1, tzinfo=UTC)) == 0
    assert stopped(workspace.pk, key.pk) is None
    assert Budget.objects.get().level == "ok"


def test_a_money_budget_of_the_workspace_costs_usage_at_the_prices(owner, workspace, make_user, sent):
    operator = make_user("op")
    operator.is_staff = True
    operator.save()
    services.price_version_create(
        actor=operator,
        effective_from=datetime(2026, 12, 1, tzinfo=UTC),
        now=datetime(2026, 11, 1, tzinfo=UTC),
        prompt_per_million="10.00",
    )
    budgets.budget_set(actor=owner, workspace=workspace, money_limit=Decimal("5.00"), hard_stop=True)
    use(workspace, None, 450_000)  # 4.50: 90 %
    budgets.budgets_evaluate(now=NOW)
    budget = Budget.objects.get()
    assert (budget.level, budget.spent_money) == ("warning", Decimal("4.500000"))
    browser = Client()
    browser.force_login(owner)
    page = browser.get("/usage/").content.decode()
    assert "data-budget-alert" in page
    assert "90%" in page
    statement = browser.get("/usage/chargeback/", {"workspace": str(workspace.pk), "month": "2026-12"})
    assert "80 % reached</span>" in statement.content.decode()
    use(workspace, None, 60_000, at=NOW - timedelta(hours=3))  # 5.10
    budgets.budgets_evaluate(now=NOW)
    assert stopped(workspace.pk, 12345)["budget"] == "the workspace's monthly budget"


def _hook_server() -> tuple[HTTPServer, list[dict], threading.Thread]:
    got: list[dict] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self):
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Hook)
    server.timeout = 2
    thread = threading.Thread(target=server.handle_request)
    thread.start()
    return server, got, thread


def test_the_webhook_task_posts_the_alert(settings):
    settings.OUTBOUND_URL_ALLOWED_HOSTS = ["127.0.0.1"]  # an operator's internal receiver, listed
    server, got, thread = _hook_server()
    try:
        tasks.budget_webhook.apply(args=(f"http://127.0.0.1:{server.server_port}/", {"threshold_percent": 80}))
        thread.join(timeout=10)
    finally:
        server.server_close()
    assert got == [{"threshold_percent": 80}]


def test_the_webhook_task_never_calls_an_address_that_is_not_public(settings):
    """An Owner's webhook is called from the control plane's network: the loopback (its Redis, PostgreSQL,
    web processes), private networks and the metadata service are not called, by address or by name."""
    settings.OUTBOUND_URL_ALLOWED_HOSTS = []
    server, got, thread = _hook_server()
    try:
        for url in (
            f"http://127.0.0.1:{server.server_port}/",
            f"http://localhost:{server.server_port}/",
            f"http://[::ffff:127.0.0.1]:{server.server_port}/",
        ):
            tasks.budget_webhook.apply(args=(url, {"threshold_percent": 80}))
        thread.join(timeout=5)
    finally:
        server.server_close()
    assert got == []
    assert outbound_urls.resolved_problem("http://localhost./x") is not None  # a name resolving to the loopback
    for url in ("http://10.1.2.3/x", "http://169.254.169.254/latest/meta-data", "http://[fd00::1]/", "ftp://a.b/"):
        assert outbound_urls.literal_problem(url) is not None, url
    assert outbound_urls.literal_problem("https://8.8.8.8/hook") is None


def test_the_budgets_api(api_client_for, owner, workspace, other_workspace, member_of):
    key, _ = workload_services.api_key_create(actor=owner, workspace=workspace, name="k", scopes=["invoke"])
    client = api_client_for(owner)
    body = {
        "workspace": str(workspace.pk),
        "api_key": key.pk,
        "token_limit": 1000,
        "hard_stop": True,
        "webhook_url": "https://hooks.example/secret-path",
    }
    response = client.put("/api/v1/budgets/", body, format="json")
    assert response.status_code == 200, response.content
    assert (response.json()["webhook"], response.json()["level"]) == ("https://hooks.example/…", "ok")
    again = client.put("/api/v1/budgets/", {**body, "token_limit": 2000}, format="json").json()
    assert again["id"] == response.json()["id"]  # set again: replaced, not added
    assert [b["token_limit"] for b in client.get("/api/v1/budgets/").json()] == [2000]
    for bad, field in (
        ({**body, "token_limit": -1}, "token_limit"),
        ({**body, "webhook_url": "not a url"}, "webhook_url"),
        ({**body, "webhook_url": "http://127.0.0.1:6379/"}, "webhook_url"),
        ({**body, "webhook_url": "http://169.254.169.254/latest/meta-data/"}, "webhook_url"),
        ({**body, "webhook_url": "http://localhost/hook"}, "webhook_url"),
        ({**body, "workspace": str(other_workspace.pk)}, "workspace"),
        ({**body, "api_key": 999999}, "api_key"),
        ({"workspace": str(workspace.pk)}, "token_limit"),
    ):
        refused = client.put("/api/v1/budgets/", bad, format="json")
        assert refused.status_code == 400, (bad, refused.content)
        assert field in refused.json()
    viewer = member_of(workspace, "viewer")
    assert api_client_for(viewer).put("/api/v1/budgets/", body, format="json").status_code == 403
    assert len(api_client_for(viewer).get("/api/v1/budgets/").json()) == 1


def test_the_beats_task_evaluates_the_budgets_and_stops_an_exceeded_one(owner, workspace, sent):
    """What the beat runs each minute (`tasks.evaluate_budgets`; it called a function its module lacks)."""
    budgets.budget_set(actor=owner, workspace=workspace, token_limit=100, hard_stop=True)
    use(workspace, None, 150, at=datetime.now(UTC))
    assert tasks.evaluate_budgets() == 1
    assert Budget.objects.get().level == "exceeded"
    assert stopped(workspace.pk, None)["type"] == "budget_exceeded"

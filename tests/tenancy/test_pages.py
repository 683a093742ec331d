"""Sign-in, sign-out, the dashboard, the sidebar and the bootstrap command."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from tenancy.models import Membership, Workspace

pytestmark = pytest.mark.django_db


def test_dashboard_requires_sign_in(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_sign_in_then_dashboard_lists_only_own_workspaces(client, owner, workspace, other_workspace):
    response = client.post("/accounts/login/", {"username": "owner", "password": "pw-owner"})
    assert response.status_code == 302
    page = client.get("/").content.decode()
    assert "Acme" in page
    assert "Globex" not in page
    # sidebar: Settings → Compute, Ray
    assert 'href="/compute/"' in page
    assert 'href="/ray/"' in page


def test_wrong_password_is_shown(client, owner):
    response = client.post("/accounts/login/", {"username": "owner", "password": "nope"})
    assert response.status_code == 200
    assert "didn't match" in response.content.decode()


def test_sign_out(client, owner):
    client.force_login(owner)
    response = client.post("/accounts/logout/")
    assert response.status_code == 302
    assert client.get("/").status_code == 302


def test_schema_and_docs_are_served(client, owner):
    client.force_login(owner)
    schema = client.get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/v1/workspaces/" in schema.content
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    assert b"swagger" in docs.content.lower()


def test_healthz(client):
    body = client.get("/healthz").json()
    assert body["status"] == "ok"
    # whether commands are being dispatched: tests/project/test_dispatch_health.py
    assert set(body["dispatch"]) == {"ok", "broker_reachable", "worker_heartbeat_age_s", "workers_alive", "queue_depth"}


def test_bootstrap_demo_is_idempotent(django_user_model):
    call_command("bootstrap_demo")
    call_command("bootstrap_demo")
    admin = django_user_model.objects.get(username="admin")
    assert admin.check_password("admin")
    assert admin.is_superuser
    assert Workspace.objects.filter(slug="demo").count() == 1
    assert Membership.objects.get(user=admin, workspace__slug="demo").role == "owner"


def test_admin_lists_tenancy_models(client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(admin)
    page = client.get("/admin/").content.decode()
    assert "Workspaces" in page
    assert "Memberships" in page

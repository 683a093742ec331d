"""Settings → Audit log: the trail of the user's workspaces with filters, paging and export links."""

from __future__ import annotations

import datetime as dt
import html

import pytest
from django.utils import timezone

from audit.models import AuditEntry
from fleet import services

pytestmark = pytest.mark.django_db


def _entry(workspace, action: str, name: str, **extra) -> AuditEntry:
    extra.setdefault("created_at", timezone.now())
    return AuditEntry.objects.create(
        workspace=workspace, actor_name="owner", action=action, target_type="node", target_name=name, **extra
    )


def test_the_page_lists_filters_and_links_exports(client, owner, workspace, other_workspace, viewer, cluster):
    services.cluster_update(actor=owner, cluster=cluster, description="GPUs")
    _entry(workspace, "node.drain", "box-7", git_commit="0123456789abcdef" * 2 + "01234567")
    _entry(other_workspace, "node.drain", "their-box")
    client.force_login(viewer)

    page = client.get("/audit/")
    assert page.status_code == 200
    text = page.content.decode()
    assert 'href="/audit/"' in text  # the sidebar link (Settings)
    for shown in ("cluster.update", "node.drain", "box-7", "0123456789ab", "Acme"):
        assert shown in text
    assert "their-box" not in text

    filtered = client.get("/audit/?action=node.drain&since=2000-01-01")
    text = html.unescape(filtered.content.decode())
    assert "box-7" in text
    assert "cluster.update</code>" not in text
    assert "/api/v1/audit/?action=node.drain&since=2000-01-01&format=csv" in text
    assert "/api/v1/audit/?action=node.drain&since=2000-01-01&format=json" in text

    partial = client.get("/audit/?outcome=refused", HTTP_HX_REQUEST="true")
    assert partial.status_code == 200
    assert b"<html" not in partial.content
    assert b"No audit entries match these filters." in partial.content

    bad = client.get("/audit/?since=someday")
    assert bad.status_code == 400
    assert b"since: Enter an ISO 8601 date" in bad.content


def test_pages_of_fifty_and_constant_queries(client, owner, workspace, django_assert_num_queries):
    client.force_login(owner)
    start = timezone.now() - dt.timedelta(hours=1)
    AuditEntry.objects.all().delete()
    _entry(workspace, "node.cordon", "n0", created_at=start)
    with django_assert_num_queries(4):  # session, user, count, page
        assert client.get("/audit/").status_code == 200
    for i in range(1, 60):
        _entry(workspace, "node.cordon", f"n{i}", created_at=start + dt.timedelta(seconds=i))
    with django_assert_num_queries(4):
        first = client.get("/audit/?target_type=node").content.decode()
    assert "n59" in first
    assert ">n9<" not in first
    assert "Page 1 of 2" in first
    second = client.get("/audit/?target_type=node&page=2").content.decode()
    assert ">n9<" in second
    assert "Page 2 of 2" in second

"""GET /api/v1/audit/: scoped to the caller's workspaces, filtered, paged, exported as CSV or JSON."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json

import pytest
from django.utils import timezone

from audit.models import AuditEntry
from fleet import services

pytestmark = pytest.mark.django_db


def _entry(workspace, action: str, *, actor: str = "owner", at: dt.datetime | None = None, **extra) -> AuditEntry:
    return AuditEntry.objects.create(
        workspace=workspace,
        actor_name=actor,
        action=action,
        target_type=action.split(".")[0],
        target_name=extra.pop("target_name", "t"),
        created_at=at or timezone.now(),
        **extra,
    )


@pytest.fixture
def api(api_client_for, owner):
    return api_client_for(owner)


def _rows(response) -> list[dict]:
    assert response.status_code == 200, response.content
    return response.json()["results"]


def test_lists_the_callers_workspaces_only_and_filters(api, owner, workspace, other_workspace, viewer, cluster):
    AuditEntry.objects.all().delete()
    day = timezone.now().replace(hour=12, minute=0, second=0, microsecond=0)
    _entry(workspace, "node.cordon", at=day - dt.timedelta(days=2))
    _entry(workspace, "cluster.create", actor="viewer-acme", at=day - dt.timedelta(days=1), outcome="refused")
    _entry(workspace, "node.drain", at=day, git_commit="a" * 40)
    theirs = _entry(other_workspace, "node.cordon", actor="globex-owner")

    assert [r["action"] for r in _rows(api.get("/api/v1/audit/"))] == ["node.drain", "cluster.create", "node.cordon"]
    assert api.get(f"/api/v1/audit/{theirs.pk}/").status_code == 404
    assert [r["action"] for r in _rows(api.get("/api/v1/audit/?actor=viewer-acme"))] == ["cluster.create"]
    assert [r["action"] for r in _rows(api.get("/api/v1/audit/?action=node.cordon"))] == ["node.cordon"]
    assert [r["action"] for r in _rows(api.get("/api/v1/audit/?target_type=node"))] == ["node.drain", "node.cordon"]
    assert [r["action"] for r in _rows(api.get("/api/v1/audit/?outcome=refused"))] == ["cluster.create"]
    yesterday = (day - dt.timedelta(days=1)).date().isoformat()
    assert [r["action"] for r in _rows(api.get(f"/api/v1/audit/?since={yesterday}&until={yesterday}"))] == [
        "cluster.create"
    ]
    since = (day - dt.timedelta(hours=1)).isoformat()
    assert [r["action"] for r in _rows(api.get("/api/v1/audit/", {"since": since}))] == ["node.drain"]
    first = _rows(api.get("/api/v1/audit/?action=node.drain"))[0]
    assert first["git_commit"] == "a" * 40
    assert set(first) == {
        "id",
        "created_at",
        "workspace",
        "actor",
        "action",
        "target_type",
        "target_id",
        "target_name",
        "outcome",
        "reason",
        "detail",
        "git_commit",
        "finished_at",
    }
    bad = api.get("/api/v1/audit/?since=yesterday&outcome=maybe")
    assert bad.status_code == 400
    assert set(bad.json()) == {"since", "outcome"}
    assert api.get("/api/v1/audit/?format=xml").json() == {"format": "Choose one of csv, json."}


def test_a_viewer_reads_the_trail_of_its_workspace(api_client_for, viewer, owner, workspace, cluster, register_node):
    node = register_node(cluster, "box")
    services.node_cordon(node=node, actor=owner)
    rows = _rows(api_client_for(viewer).get("/api/v1/audit/?action=node.cordon"))
    assert [(r["actor"], r["target_name"], r["outcome"]) for r in rows] == [("owner", "box", "ok")]


def test_exports_every_match_as_csv_or_json(api, workspace, other_workspace):
    AuditEntry.objects.all().delete()
    start = timezone.now() - dt.timedelta(hours=1)
    for i in range(105):  # more than one page (PAGE_SIZE 100)
        _entry(workspace, "node.cordon", at=start + dt.timedelta(seconds=i), target_name=f"n{i}")
    _entry(workspace, "node.drain", detail={"why": 'comma, "quote"'})
    _entry(other_workspace, "node.cordon")
    assert len(_rows(api.get("/api/v1/audit/?action=node.cordon"))) == 100

    exported = api.get("/api/v1/audit/?action=node.cordon&format=csv")
    assert exported.status_code == 200
    assert exported["Content-Type"] == "text/csv; charset=utf-8"
    assert exported["Content-Disposition"].startswith('attachment; filename="audit-')
    table = list(csv.DictReader(io.StringIO(b"".join(exported.streaming_content).decode())))
    assert len(table) == 105
    assert [r["target_name"] for r in table[:2]] == ["n104", "n103"]
    assert table[0]["actor"] == "owner"
    drained = api.get("/api/v1/audit/?action=node.drain&format=csv")
    (row,) = csv.DictReader(io.StringIO(b"".join(drained.streaming_content).decode()))
    assert json.loads(row["detail"]) == {"why": 'comma, "quote"'}

    as_json = api.get("/api/v1/audit/?format=json&target_type=node")
    assert as_json["Content-Type"] == "application/json"
    body = json.loads(b"".join(as_json.streaming_content))
    assert (body["count"], body["next"], body["previous"], len(body["results"])) == (106, None, None, 106)
    assert body["results"][0]["action"] == "node.drain"


def test_list_and_export_queries_do_not_grow_with_entries(api, workspace, django_assert_num_queries):
    _entry(workspace, "node.cordon")
    with django_assert_num_queries(2):  # count, page
        assert len(_rows(api.get("/api/v1/audit/"))) >= 1
    for i in range(30):
        _entry(workspace, "node.drain", target_name=f"n{i}")
    with django_assert_num_queries(2):
        assert len(_rows(api.get("/api/v1/audit/"))) >= 31
    with django_assert_num_queries(2):  # count, rows
        response = api.get("/api/v1/audit/?format=json")
        assert json.loads(b"".join(response.streaming_content))["count"] >= 31


def test_the_csv_export_writes_formula_like_names_as_text(api, workspace):
    """A key named `=HYPERLINK(…)` must not run in the Owner's spreadsheet: such cells start with a quote."""
    AuditEntry.objects.all().delete()
    hostile = ['=HYPERLINK("http://evil.example","x")', "+1+1", "-2+3", "@SUM(A1)", "\tTAB", "\rCR"]
    for name in hostile:
        _entry(workspace, "api_key.create", target_name=name, actor=name)
    _entry(workspace, "api_key.create", target_name="plain-name")
    exported = api.get("/api/v1/audit/?format=csv")
    table = list(csv.DictReader(io.StringIO(b"".join(exported.streaming_content).decode(), newline="")))
    names = sorted(r["target_name"] for r in table)
    assert names == sorted(["'" + n for n in hostile] + ["plain-name"])
    assert sorted(r["actor"] for r in table if r["target_name"] != "plain-name") == sorted("'" + n for n in hostile)

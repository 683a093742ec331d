"""The Commands tab: filters, paging, the control plane's own commands, the send form, error cells, live rows."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet import services
from fleet.models import Command, CommandStatus

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}
TRACEBACK = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nValueError: the disk is full'


@pytest.fixture
def browser(client, owner):
    client.force_login(owner)
    return client


def _user_command(owner, cluster, node, command_type="model.download", **payload):
    (command,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type=command_type, payload=payload or {"model_id": "acme/tiny"}, node=node
    )
    return command


def _system_command(owner, cluster, node):
    """A command the control plane sends on its own (outside any operator action), like the Ray status poll."""
    (command,) = services.command_queue(
        actor=owner, cluster=cluster, command_type="container.stop", payload={"container": "web"}, node=node
    )
    return command


def _rows(html: str) -> list[str]:
    return re.findall(r'<tr id="command-([0-9a-f-]+)"', html)


def test_system_commands_are_credited_to_system_and_hidden_by_default(browser, owner, cluster, node):
    mine = _user_command(owner, cluster, node)
    theirs = _system_command(owner, cluster, node)
    assert (mine.system, mine.created_by) == (False, owner)
    assert (theirs.system, theirs.created_by) == (True, None)
    assert "queued by system" in node.events.get(command=theirs).message

    page = browser.get(f"/compute/clusters/{cluster.pk}/commands/").content.decode()
    assert _rows(page) == [str(mine.pk)]
    assert "Show system commands" in page

    shown = browser.get(f"/compute/clusters/{cluster.pk}/commands/?show_system=1").content.decode()
    assert set(_rows(shown)) == {str(mine.pk), str(theirs.pk)}
    row = shown[shown.index(f'id="command-{theirs.pk}"') :].split("</tr>")[0]
    assert ">system<" in row
    assert "owner" not in row

    only_system = browser.get(f"/compute/clusters/{cluster.pk}/commands/?by=system").content.decode()
    assert _rows(only_system) == [str(theirs.pk)]
    by_owner = browser.get(f"/compute/clusters/{cluster.pk}/commands/?by=owner&show_system=1").content.decode()
    assert _rows(by_owner) == [str(mine.pk)]


def test_filters_by_node_type_and_status(browser, owner, cluster, node, register_node):
    other = register_node(cluster, "cpu-box-2")
    download = _user_command(owner, cluster, node)
    stop = _user_command(owner, cluster, other, "container.stop", container="web")
    Command.objects.filter(pk=stop.pk).update(status=CommandStatus.FAILED, error_code="x", error_message="no")
    url = f"/compute/clusters/{cluster.pk}/commands/"
    assert _rows(browser.get(f"{url}?node={other.pk}").content.decode()) == [str(stop.pk)]
    assert _rows(browser.get(f"{url}?command_type=model.download").content.decode()) == [str(download.pk)]
    assert _rows(browser.get(f"{url}?status=failed").content.decode()) == [str(stop.pk)]
    empty = browser.get(f"{url}?status=failed&node={node.pk}").content.decode()
    assert _rows(empty) == []
    assert "No commands match these filters." in empty
    bad = browser.get(f"{url}?status=bogus")
    assert bad.status_code == 400
    assert "status: Choose one of" in bad.content.decode()
    form = browser.get(url).content.decode()
    for name in ("node", "command_type", "status", "by", "show_system"):
        assert f'name="{name}"' in form


def test_paging_keeps_the_filters(browser, owner, cluster, node):
    sent = [_user_command(owner, cluster, node) for _ in range(27)]
    url = f"/compute/clusters/{cluster.pk}/commands/?command_type=model.download"
    first = browser.get(url).content.decode()
    assert len(_rows(first)) == 25
    assert "Page 1 of 2" in first
    assert 'href="?command_type=model.download&amp;page=2"' in first
    second = browser.get(f"{url}&page=2").content.decode()
    assert len(_rows(second)) == 2
    assert set(_rows(first)) | set(_rows(second)) == {str(c.pk) for c in sent}


def test_ray_commands_are_never_offered_nor_accepted(browser, cluster, node):
    page = browser.get(f"/compute/clusters/{cluster.pk}/commands/").content.decode()
    form = page[page.index('id="command-form"') :]
    offered = re.findall(r'<option value="([a-z.]+)"', form.split("</select>")[0])
    assert offered
    assert "container.create" in offered
    assert not [t for t in offered if t.startswith("ray.")]
    response = browser.post(
        f"/compute/clusters/{cluster.pk}/commands/", {"command_type": "ray.status", "target": "all"}
    )
    assert response.status_code == 400
    assert not Command.objects.exists()


def test_target_and_type_are_remembered_after_a_send(browser, cluster, node):
    response = browser.post(
        f"/compute/clusters/{cluster.pk}/commands/",
        {"command_type": "container.stop", "target": str(node.pk), "p-container": "web"},
    )
    assert response.status_code == 302
    page = browser.get(f"/compute/clusters/{cluster.pk}/commands/").content.decode()
    assert f'<option value="{node.pk}" selected>' in page
    assert 'name="p-container"' in page  # the container.stop fields
    assert re.search(r'<option value="container.stop"\s+selected>', page)


def test_error_cell_shows_the_last_line_and_the_whole_text_on_demand(browser, owner, cluster, node):
    long = _user_command(owner, cluster, node)
    short = _user_command(owner, cluster, node)
    Command.objects.filter(pk=long.pk).update(status="failed", error_code="internal", error_message=TRACEBACK)
    Command.objects.filter(pk=short.pk).update(status="failed", error_code="auth", error_message="bad token")
    page = browser.get(f"/compute/clusters/{cluster.pk}/commands/").content.decode()
    row = page[page.index(f'id="command-{long.pk}"') :].split("</tr>")[0]
    summary = re.search(r"<summary[^>]*>(.*?)</summary>", row, re.S).group(1)
    assert summary == "internal: ValueError: the disk is full"
    assert "Traceback (most recent call last):" in row.split("</summary>")[1]  # inside <details>
    row = page[page.index(f'id="command-{short.pk}"') :].split("</tr>")[0]
    assert "<details" not in row
    assert "auth: bad token" in row


def test_recent_commands_poll_until_every_row_settles(browser, owner, cluster, node):
    command = _user_command(owner, cluster, node)
    url = f"/compute/clusters/{cluster.pk}/commands/"
    page = browser.get(url).content.decode()
    assert 'id="commands" hx-get="/compute/clusters/' in page
    assert 'hx-trigger="every 3s"' in page
    poll = browser.get(url, HTTP_HX_TRIGGER="commands", **HX)
    assert poll.status_code == 200
    assert 'data-live="3"' in poll.content.decode()
    Command.objects.filter(pk=command.pk).update(status=CommandStatus.SUCCEEDED)
    poll = browser.get(url, HTTP_HX_TRIGGER="commands", **HX)
    assert poll.status_code == 286  # htmx stops polling; the settled rows are still swapped in
    body = poll.content.decode()
    assert "<html" not in body
    assert "Succeeded" in body
    assert "hx-trigger" not in body


def test_recent_commands_partial_query_count_does_not_grow_with_rows(browser, owner, cluster, node, register_node):
    url = f"/compute/clusters/{cluster.pk}/commands/?show_system=1"
    _user_command(owner, cluster, node)
    with CaptureQueriesContext(connection) as few:
        assert browser.get(url, **HX).status_code == 200
    other = register_node(cluster, "cpu-box-2")
    for target in (node, other) * 6:
        _user_command(owner, cluster, target)
        _system_command(owner, cluster, target)
    with CaptureQueriesContext(connection) as many:
        body = browser.get(url, **HX).content.decode()
    assert len(_rows(body)) == 25
    # session, user, cluster, the count for the pager, the page of rows (nodes and senders joined)
    assert len(many) == len(few) == 5, [q["sql"] for q in many.captured_queries]


def test_api_filters_system_and_sender(browser, owner, cluster, node):
    mine = _user_command(owner, cluster, node)
    theirs = _system_command(owner, cluster, node)
    url = f"/api/v1/commands/?cluster={cluster.pk}"
    rows = browser.get(f"{url}&system=false").json()["results"]
    assert [r["id"] for r in rows] == [str(mine.pk)]
    rows = browser.get(f"{url}&by=system").json()["results"]
    assert [(r["id"], r["system"], r["created_by"]) for r in rows] == [(str(theirs.pk), True, None)]
    assert browser.get(f"{url}&system=maybe").status_code == 400

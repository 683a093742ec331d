"""A rolling update whose replacement fails to start: the old replicas keep serving, the update is called
off (the other replacement still starting is stopped), the endpoint's settings go back to what it serves,
and its page says why and what to do until the next update."""

from __future__ import annotations

import pytest
from django.urls import reverse

from fleet.models import Command
from fleet.workloads import services as workloads
from fleet.workloads.models import EndpointEvent, EndpointReplica, EndpointStatus
from tests.fleet import agent_side
from tests.fleet.workloads import test_endpoint_update

pytestmark = pytest.mark.django_db

running = test_endpoint_update.running  # two replicas of acme/tiny@main running on nodes a and b


def test_a_failed_replacement_calls_the_update_off_and_the_page_says_why(running, owner, client):
    olds = list(EndpointReplica.objects.filter(endpoint=running).order_by("created_at", "server_id"))
    endpoint = workloads.endpoint_update(actor=owner, endpoint=running, server_args=["--max-model-len", "64"])
    news = [EndpointReplica.objects.get(replacement_of=old) for old in olds]

    agent_side.error(news[0].start_command, "internal", "endpoint server exited with status 1 before answering")
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.RUNNING
    assert (endpoint.revision, endpoint.server_args) == ("main", [])  # what the old replicas serve
    assert [EndpointReplica.objects.get(pk=o.pk).status for o in olds] == [EndpointStatus.RUNNING] * 2
    other = EndpointReplica.objects.get(pk=news[1].pk)
    assert other.status == EndpointStatus.STOPPING  # the update is called off: its other replacement stops
    assert other.retired_at is not None
    assert Command.objects.get(pk=other.stop_command_id).payload == {"endpoint_id": other.server_id}

    event = EndpointEvent.objects.get(endpoint=endpoint, kind="endpoint.update_failed")
    assert "the update to acme/tiny@main with --max-model-len 64 failed" in event.message
    assert "exited with status 1" in event.message
    assert f"Replica {olds[0].server_id} keeps serving acme/tiny@main with no extra server arguments" in event.message
    assert "the endpoint's settings are back to those" in event.message
    assert event.data["server_args"] == {"old": [], "new": ["--max-model-len", "64"]}

    client.force_login(owner)
    page = client.get(reverse("workloads:endpoint_detail", args=[endpoint.pk])).content.decode()
    assert 'id="update-failed"' in page
    assert "The last update failed." in page
    assert "correct the server arguments or revision, then update again" in page
    partial = client.get(
        reverse("workloads:endpoint_detail", args=[endpoint.pk]), headers={"HX-Request": "true"}
    ).content.decode()
    assert 'id="update-failed"' in partial  # the polled replicas card shows it without a reload

    # the old replicas are current again: the next update replaces both, and the page's note goes
    workloads.endpoint_update(actor=owner, endpoint=endpoint, server_args=["--max-model-len", "32"])
    again = EndpointReplica.objects.filter(replacement_of__in=olds)
    assert [r.start_command.payload["extra_args"] for r in again] == [["--max-model-len", "32"]] * 2
    assert (
        'id="update-failed"'
        not in client.get(reverse("workloads:endpoint_detail", args=[endpoint.pk])).content.decode()
    )


def test_a_failed_start_of_a_replica_that_replaces_nothing_is_no_update_failure(running, owner):
    replica = EndpointReplica.objects.filter(endpoint=running).first()
    workloads.endpoint_stop(actor=owner, endpoint=running)
    for r in EndpointReplica.objects.filter(endpoint=running):
        agent_side.result(r.stop_command)
    endpoint = workloads.endpoint_restart(actor=owner, endpoint=running)
    replica.refresh_from_db()
    agent_side.error(replica.start_command, "internal", "crashed")
    assert not EndpointEvent.objects.filter(endpoint=endpoint, kind="endpoint.update_failed").exists()

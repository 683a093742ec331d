"""Scale to zero on a real agent, through the control plane's tunnel proxy: an endpoint with min_replicas 0
and a short idle timeout is scaled to zero by the idle pass (its server process stops, the page and the API
say so), then one request wakes it: it waits through the cold start and is answered, and the endpoint runs
again. The agent starts the OpenAI-compatible stand-in `tests.support.openai_standin`.
"""

from __future__ import annotations

import socket
import sys

import pytest
import requests
from django.test import Client
from django.urls import reverse
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from fleet import services
from fleet.models import Command
from fleet.workloads import services as workload_services
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.tasks import endpoints_heal_tick, endpoints_idle_tick
from tests.e2e.conftest import node_of, wait_status
from tests.support.processes import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_an_idle_endpoint_scales_to_zero_and_the_next_request_starts_it_again(
    control_plane, cluster, operator, agents, settings
):
    user, _ = operator
    server = {"CLEVERTHIS_ENDPOINT_SERVER": f"{sys.executable} -m tests.support.openai_standin"}
    _, state, _ = agents(control_plane, cluster, user, "gpu-a", extra_env=server)
    node = node_of(state)
    wait_status(node, "online")
    (download,) = services.command_dispatch(
        actor=user, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}, node=node
    )
    wait_until(lambda: Command.objects.get(pk=download.pk).status == "succeeded", timeout=60, what="download")
    endpoint = workload_services.endpoint_create(
        actor=user, cluster=cluster, model_id="acme/tiny", min_replicas=0, idle_timeout_s=1
    )
    running = EndpointStatus.RUNNING
    wait_until(lambda: Endpoint.objects.get(pk=endpoint.pk).status == running, timeout=60, what="running")
    (first,) = EndpointReplica.objects.filter(endpoint=endpoint)
    assert listening(first.port)

    # quiet for its idle timeout: the beat's idle pass scales it to zero, the healing pass stops the server
    wait_until(lambda: endpoints_idle_tick() == [str(endpoint.pk)], timeout=30, interval=0.5, what="the idle pass")
    settings.ENDPOINT_DRAIN_S = 0
    endpoints_heal_tick()
    stopped = EndpointStatus.STOPPED
    wait_until(lambda: EndpointReplica.objects.get(pk=first.pk).status == stopped, timeout=60, what="stopped")
    wait_until(lambda: not listening(first.port), timeout=30, what="the server process gone")
    assert Endpoint.objects.get(pk=endpoint.pk).status == EndpointStatus.IDLE
    api = APIClient()
    api.force_authenticate(user=user)
    assert api.get(f"/api/v1/endpoints/{endpoint.pk}/").json()["status"] == "idle"
    page = Client()
    page.force_login(user)
    assert "Scaled to zero" in page.get(reverse("workloads:endpoint_list")).content.decode()

    # one request wakes it and waits for its replica, then is answered
    token = Token.objects.create(user=user)
    answer = requests.post(
        f"{control_plane.url}/v1/chat/completions",
        headers={"Authorization": f"Token {token.key}", "Host": endpoint.hostname},
        json={"model": "acme/tiny", "messages": [{"role": "user", "content": "wake up"}]},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "echo: wake up"
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.RUNNING
    assert endpoint.events.filter(kind="endpoint.cold_start").count() == 1
    assert endpoint.events.filter(kind="endpoint.scaled_to_zero").count() == 1

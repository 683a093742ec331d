"""An inference endpoint end to end: model download → endpoint.start on the node → requests through the
control plane's tunnel proxy (the web server) to the node, which accepts no inbound connection of its own.

vLLM cannot run here (its wheel pins a CUDA torch): the agent starts the OpenAI-compatible stand-in
`tests.support.openai_standin` with the exact arguments it would give vLLM.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import psutil
import pytest
import requests
from django.conf import settings
from rest_framework.authtoken.models import Token

from fleet import services
from fleet.usage.models import UsageRollup
from fleet.workloads import services as workload_services
from fleet.workloads.models import Endpoint
from tests.e2e.conftest import node_of, wait_status
from tests.support.live import agent_run
from tests.support.processes import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def running_endpoint(control_plane, cluster, operator, agents):
    user, _ = operator
    server = f"{sys.executable} -m tests.support.openai_standin"
    proc, state, env = agents(control_plane, cluster, user, "gpu", extra_env={"CLEVERTHIS_ENDPOINT_SERVER": server})
    node = node_of(state)
    wait_status(node, "online")
    (download,) = services.command_dispatch(
        actor=user, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}, node=node
    )
    wait_until(lambda: type(download).objects.get(pk=download.pk).status == "succeeded", timeout=60, what="download")
    endpoint = workload_services.endpoint_create(actor=user, cluster=cluster, model_id="acme/tiny")
    wait_until(
        lambda: Endpoint.objects.get(pk=endpoint.pk).status in ("running", "failed"), timeout=60, what="endpoint up"
    )
    endpoint.refresh_from_db()
    assert endpoint.status == "running", endpoint.failure_message
    return endpoint, user, (proc, state, env)


def test_endpoint_answers_through_the_tunnel(control_plane, running_endpoint):
    endpoint, user, _ = running_endpoint
    assert endpoint.url == f"https://endpoint-{endpoint.slug}.endpoints.localhost"
    token = Token.objects.create(user=user)
    # on the endpoint's own origin (its host name; the web server answers every name on this address)
    auth = {"Authorization": f"Token {token.key}", "Host": endpoint.hostname}
    base = control_plane.url

    models = requests.get(f"{base}/v1/models", headers=auth, timeout=30)
    assert models.status_code == 200, models.text
    assert models.json()["data"][0]["id"] == "acme/tiny"

    # the path form on the control plane's own host is never proxied: it redirects to the origin
    path_form = requests.get(
        f"{control_plane.url}/endpoints/{endpoint.slug}/v1/models?a=1",
        headers=auth | {"Host": "127.0.0.1"},
        allow_redirects=False,
        timeout=30,
    )
    assert path_form.status_code == 307
    assert path_form.headers["location"] == f"http://{endpoint.hostname}/v1/models?a=1"
    assert "acme/tiny" not in path_form.text

    # streaming chat completion arrives as server-sent events
    with requests.post(
        f"{base}/v1/chat/completions",
        headers=auth,
        json={"model": "acme/tiny", "stream": True, "messages": [{"role": "user", "content": "hello tunnel world"}]},
        stream=True,
        timeout=30,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == b"data: [DONE]"
    words = [json.loads(line[6:])["choices"][0]["delta"].get("content", "") for line in lines[:-1]]
    assert "".join(words).strip() == "echo: hello tunnel world"


def _chat(base: str, auth: dict, content: str, **extra: object) -> list[bytes]:
    with requests.post(
        f"{base}/v1/chat/completions",
        headers=auth,
        json={"model": "acme/tiny", "messages": [{"role": "user", "content": content}], **extra},
        stream=bool(extra.get("stream")),
        timeout=30,
    ) as response:
        assert response.status_code == 200, response.text
        return [line for line in response.iter_lines() if line]


def test_usage_rollups_match_the_tokens_the_server_reported(control_plane, running_endpoint):
    """Through the real web server, tunnel, agent and server: the rollups hold what the answers reported."""
    endpoint, user, _ = running_endpoint
    token = Token.objects.create(user=user)
    auth = {"Authorization": f"Token {token.key}", "Host": endpoint.hostname}
    base = control_plane.url
    reported = []
    (whole,) = _chat(base, auth, "one two three")  # a JSON answer
    reported.append(json.loads(whole)["usage"])
    streamed = _chat(base, auth, "four five", stream=True, stream_options={"include_usage": True})
    reported.append(json.loads(streamed[-2][6:])["usage"])  # the final chunk, before [DONE]
    # a stream that does not ask for usage: the proxy asks the server for it and drops the usage chunk,
    # so the client sees the stream it asked for and the meter the server's own count (prompt included)
    plain = _chat(base, auth, "six seven eight nine", stream=True)
    assert plain[-1] == b"data: [DONE]"
    assert all(json.loads(line[6:])["choices"] for line in plain[:-1])  # content chunks only
    assert len(plain) - 1 == 5  # "echo: six seven eight nine", one chunk a word
    prompt = sum(u["prompt_tokens"] for u in reported) + 4
    completion = sum(u["completion_tokens"] for u in reported) + 5
    assert (prompt, completion) == (5 + 4, 4 + 3 + 5)  # (the stand-in counts words: "echo: one two three" is 4)

    def minute_rows() -> list[UsageRollup]:
        return list(UsageRollup.objects.filter(granularity="minute", subject_id=endpoint.pk))

    wait_until(lambda: sum(r.requests for r in minute_rows()) == 3, timeout=30, what="usage written")
    rows = minute_rows()
    assert sum(r.prompt_tokens for r in rows) == prompt
    assert sum(r.completion_tokens for r in rows) == completion
    assert sum(r.errors for r in rows) == 0
    assert {(r.workspace_id, r.api_key_id) for r in rows} == {(endpoint.cluster.workspace_id, None)}
    hours = UsageRollup.objects.filter(granularity="hour", subject_id=endpoint.pk)
    assert sum(r.completion_tokens for r in hours) == completion


def test_endpoint_refuses_anonymous_and_unknown(control_plane, running_endpoint):
    endpoint, _, _ = running_endpoint
    url = f"{control_plane.url}/v1/models"
    on_origin = {"Host": endpoint.hostname}
    anonymous = requests.get(url, headers=on_origin, timeout=30)
    assert anonymous.status_code == 401
    assert "needs an API key" in anonymous.text
    unknown = requests.get(url, headers={"Host": f"endpoint-000000000000.{settings.ENDPOINT_DOMAIN}"}, timeout=30)
    assert unknown.status_code == 404
    # made public by another process: the web server sees it once its cached route expires (PROXY_ROUTE_CACHE_S)
    Endpoint.objects.filter(pk=endpoint.pk).update(public=True)

    def status() -> int:
        return requests.get(url, headers=on_origin, timeout=30).status_code

    wait_until(lambda: status() == 200, timeout=10, interval=0.5, what="public")
    # and private again: anonymous callers are refused again within the same bound
    Endpoint.objects.filter(pk=endpoint.pk).update(public=False)
    wait_until(lambda: status() == 401, timeout=10, interval=0.5, what="private")


def test_proxy_waits_for_a_reconnecting_agent_instead_of_failing(control_plane, running_endpoint, tmp_path):
    endpoint, user, (proc, state, env) = running_endpoint
    token = Token.objects.create(user=user)
    proc.kill()  # the agent dies; its endpoint server (own session) keeps running
    restarted = []
    timer = threading.Timer(2.0, lambda: restarted.append(agent_run(state, tmp_path, name="agent-back", env=env)))
    timer.start()
    try:
        started = time.monotonic()
        response = requests.get(
            f"{control_plane.url}/v1/models",
            headers={"Authorization": f"Token {token.key}", "Host": endpoint.hostname},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        assert time.monotonic() - started >= 1.5  # it really waited for the reconnect
    finally:
        timer.join()
        for agent in restarted:
            agent.stop()


def test_request_body_over_the_limit_is_413(control_plane, running_endpoint):
    endpoint, user, _ = running_endpoint
    token = Token.objects.create(user=user)
    response = requests.post(
        f"{control_plane.url}/v1/chat/completions",
        headers={"Authorization": f"Token {token.key}", "Content-Type": "application/json", "Host": endpoint.hostname},
        data=b"x" * (9 * 1024 * 1024),
        timeout=60,
    )
    assert response.status_code == 413
    assert "exceeds" in response.text


def test_deleting_the_node_stops_its_endpoint_server(control_plane, running_endpoint):
    endpoint, user, (proc, state, _) = running_endpoint
    records = json.loads((state / "work" / "endpoints" / "endpoints.json").read_text())
    server = psutil.Process(records[endpoint.slug]["pid"])
    services.node_delete(node=endpoint.node, actor=user)

    endpoint.refresh_from_db()
    assert (endpoint.status, endpoint.failure_code) == ("stopped", "node_deleted")
    assert "was deleted" in endpoint.failure_message
    wait_until(lambda: not _running(server), timeout=30, what="the endpoint's server to stop")
    assert proc.popen.wait(timeout=30) == 3, proc.log()  # the revoked agent exits and stays down (EXIT_REVOKED)


def test_an_offline_nodes_endpoint_is_marked_lost_when_the_node_is_deleted(control_plane, running_endpoint):
    endpoint, user, (proc, _, _) = running_endpoint
    proc.kill()
    node = endpoint.node
    wait_until(lambda: not type(node).objects.get(pk=node.pk).connected, timeout=30, what="tunnel closed")
    services.node_delete(node=node, actor=user)

    endpoint.refresh_from_db()
    assert (endpoint.status, endpoint.failure_code, endpoint.node) == ("failed", "node_lost", None)
    assert "could not be reached" in endpoint.failure_message


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

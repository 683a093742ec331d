"""Real vLLM (the CPU build) behind an inference endpoint, end to end with real processes.

A tiny Llama (`tests.support.tiny_llm`) is built for the test and published through the Hub stand-in →
`model.download` to a node → `endpoint.start` runs vLLM's OpenAI server from the node's model cache →
a completion and a streaming chat completion through the endpoint's URL (its own host name, through
daphne and the tunnel), whose usage rollups hold the tokens vLLM reported → `endpoint.stop` leaves
none of the server's processes behind.

Needs the virtualenv `.ci/vllm-venv` builds (cached outside the clone; `.ci/test` runs it): without it
these tests skip. vLLM takes ~3.2 GB of memory and up to a minute or two to start on two busy cores.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest
import requests
from rest_framework.authtoken.models import Token

from fleet import services
from fleet.models import Command
from fleet.usage.models import UsageRollup
from fleet.workloads import services as workload_services
from fleet.workloads.models import Endpoint, NodeModel
from tests.e2e.conftest import node_of, wait_status
from tests.support.processes import REPO_ROOT, wait_until
from tests.support.tiny_llm import build, require_vllm_python

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True), pytest.mark.timeout(1500)]

MODEL = "acme/tiny-llama"


@pytest.fixture(scope="module")
def engine_python() -> str:
    return require_vllm_python()


@pytest.fixture(scope="module")
def tiny_model(engine_python: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    return build(tmp_path_factory.mktemp("tiny-llama"), engine_python)


def server_tree(state: Path, endpoint: Endpoint) -> list[psutil.Process]:
    """The endpoint server's process and its descendants, from the agent's endpoint records."""
    records = json.loads((state / "work" / "endpoints" / "endpoints.json").read_text())
    root = psutil.Process(records[endpoint.slug]["pid"])
    return [root, *root.children(recursive=True)]


def test_real_vllm_endpoint_through_the_tunnel(
    control_plane, cluster, operator, agents, hub, engine_python, tiny_model
):
    user, _ = operator
    hub.add_repo(MODEL, tiny_model)
    env = {"CLEVERTHIS_VLLM_CPU_PYTHON": engine_python, "PYTHONPATH": str(REPO_ROOT)}
    _, state, _ = agents(control_plane, cluster, user, "cpu", extra_env=env)
    node = node_of(state)
    wait_status(node, "online")

    (download,) = services.command_dispatch(
        actor=user, cluster=cluster, command_type="model.download", payload={"model_id": MODEL}, node=node
    )
    wait_until(lambda: Command.objects.get(pk=download.pk).status == "succeeded", timeout=120, what="download")
    cached = NodeModel.objects.get(node=node, model_id=MODEL)
    assert cached.size_bytes == sum(len(b) for b in tiny_model.values())

    asked = time.monotonic()
    endpoint = workload_services.endpoint_create(actor=user, cluster=cluster, model_id=MODEL)
    assert endpoint.node_id == node.pk
    wait_until(
        lambda: Endpoint.objects.get(pk=endpoint.pk).status in ("running", "failed"),
        timeout=900,
        interval=1,
        what="vLLM endpoint up",
    )
    endpoint.refresh_from_db()
    assert endpoint.status == "running", endpoint.failure_message
    print(f"endpoint start: {time.monotonic() - asked:.0f} s from endpoint_create to running")
    start = Command.objects.get(pk=endpoint.start_command_id)
    assert start.result["device"] == "cpu"

    token = Token.objects.create(user=user)
    auth = {"Authorization": f"Token {token.key}", "Host": endpoint.hostname}
    base = control_plane.url

    models = requests.get(f"{base}/v1/models", headers=auth, timeout=60)
    assert models.status_code == 200, models.text
    assert [m["id"] for m in models.json()["data"]] == [MODEL]
    assert models.json()["data"][0]["owned_by"] == "vllm"  # the real engine answered, not a stand-in

    completion = requests.post(
        f"{base}/v1/completions",
        headers=auth,
        json={"model": MODEL, "prompt": "the fleet runs", "max_tokens": 12, "temperature": 0, "ignore_eos": True},
        timeout=120,
    )
    assert completion.status_code == 200, completion.text
    body = completion.json()
    assert body["usage"]["completion_tokens"] == 12
    assert body["choices"][0]["text"]

    with requests.post(
        f"{base}/v1/chat/completions",
        headers=auth,
        json={
            "model": MODEL,
            "stream": True,
            "max_tokens": 16,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},  # vLLM then ends with a chunk of usage
            "messages": [{"role": "user", "content": "hello tunnel world"}],
        },
        stream=True,
        timeout=120,
    ) as response:
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == b"data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert len([p for p in pieces if p]) >= 8  # arrived token by token
    assert all(c["model"] == MODEL for c in chunks)
    streamed_usage = chunks[-1]["usage"]
    assert streamed_usage["completion_tokens"] == 16

    # the same stream without asking for usage: the client gets no usage chunk, and the meter still has
    # vLLM's own count (the proxy asked for it), prompt tokens included, not one token per event
    with requests.post(
        f"{base}/v1/chat/completions",
        headers=auth,
        json={
            "model": MODEL,
            "stream": True,
            "max_tokens": 16,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": "hello tunnel world"}],
        },
        stream=True,
        timeout=120,
    ) as response:
        assert response.status_code == 200, response.text
        plain = [line for line in response.iter_lines() if line]
    assert plain[-1] == b"data: [DONE]"
    assert all(json.loads(line[6:])["choices"] for line in plain[:-1])  # no usage chunk reached the client

    # usage metering: the endpoint's rollups hold exactly the tokens vLLM reported for the requests
    # (/v1/models too is a request, with no tokens)
    prompt = body["usage"]["prompt_tokens"] + 2 * streamed_usage["prompt_tokens"]
    completion = body["usage"]["completion_tokens"] + 2 * streamed_usage["completion_tokens"]

    def metered() -> tuple[int, int, int, int]:
        rows = UsageRollup.objects.filter(granularity="minute", subject_id=endpoint.pk)
        return (
            sum(r.requests for r in rows),
            sum(r.errors for r in rows),
            sum(r.prompt_tokens for r in rows),
            sum(r.completion_tokens for r in rows),
        )

    wait_until(lambda: metered()[0] == 4, timeout=30, what="usage written")
    assert metered() == (4, 0, prompt, completion)
    print(f"usage metered: {prompt} prompt and {completion} completion tokens, as vLLM reported")

    if os.environ.get("VLLM_E2E_MEASURE"):  # figures for the notes (-s shows them); never asserted
        from bench.vllm_tokens import measure

        direct = f"http://127.0.0.1:{endpoint.port}"
        measure(direct, MODEL, concurrency=1, requests_per_worker=1)
        for concurrency in (1, 8):
            here = measure(direct, MODEL, concurrency=concurrency)
            there = measure(base, MODEL, concurrency=concurrency, headers=auth)
            print(f"concurrency {concurrency}: direct {here:,.0f} tokens/s, endpoint URL {there:,.0f} tokens/s")

    tree = server_tree(state, endpoint)
    assert len(tree) >= 2  # vLLM runs its engine core in a child process
    workload_services.endpoint_stop(actor=user, endpoint=endpoint)
    wait_until(lambda: Endpoint.objects.get(pk=endpoint.pk).status == "stopped", timeout=120, what="endpoint stopped")
    wait_until(lambda: not any(p.is_running() and p.status() != "zombie" for p in tree), timeout=30, what="no process")


def test_endpoint_for_a_model_not_in_the_cache_fails_at_once(control_plane, cluster, operator, agents, engine_python):
    """Sent straight from the Commands tab to a node without the weights: the docs' reason, not a timeout."""
    user, _ = operator
    _, state, _ = agents(control_plane, cluster, user, "cpu", extra_env={"CLEVERTHIS_VLLM_CPU_PYTHON": engine_python})
    node = node_of(state)
    wait_status(node, "online")
    (start,) = services.command_dispatch(
        actor=user,
        cluster=cluster,
        command_type="endpoint.start",
        payload={"model_id": "acme/absent"},
        node=node,
    )
    wait_until(lambda: Command.objects.get(pk=start.pk).status == "failed", timeout=60, what="start failed")
    start.refresh_from_db()
    assert start.error_code == "weights_missing"
    assert start.error_message.startswith("model weights are not yet downloaded")
    # the command made the same endpoint record the Endpoints page lists, failed with the reason
    endpoint = Endpoint.objects.get(slug=start.payload["endpoint_id"])
    assert (endpoint.node_id, endpoint.status, endpoint.failure_code) == (node.pk, "failed", "weights_missing")


def test_two_real_vllm_replicas_share_requests_and_one_survives_the_other_agent(
    control_plane, cluster, operator, agents, hub, engine_python, tiny_model
):
    """An endpoint of two replicas, each real vLLM on its own agent: completions go to both servers (their
    access logs say so), and once one agent dies every completion is answered by the other."""
    from fleet.workloads.models import EndpointReplica

    user, _ = operator
    hub.add_repo(MODEL, tiny_model)
    env = {"CLEVERTHIS_VLLM_CPU_PYTHON": engine_python, "PYTHONPATH": str(REPO_ROOT)}
    started = {name: agents(control_plane, cluster, user, name, extra_env=env) for name in ("cpu-a", "cpu-b")}
    for _, state, _ in started.values():
        node = node_of(state)
        wait_status(node, "online")
        (download,) = services.command_dispatch(
            actor=user, cluster=cluster, command_type="model.download", payload={"model_id": MODEL}, node=node
        )
        wait_until(lambda d=download: Command.objects.get(pk=d.pk).status == "succeeded", timeout=120, what="download")
    endpoint = workload_services.endpoint_create(actor=user, cluster=cluster, model_id=MODEL, min_replicas=2)
    replicas = EndpointReplica.objects.filter(endpoint=endpoint)
    wait_until(
        lambda: {r.status for r in replicas.all()} <= {"running", "failed"},
        timeout=1200,
        interval=2,
        what="two vLLM replicas up",
    )
    assert [r.status for r in replicas.all()] == ["running", "running"], [r.failure_message for r in replicas]
    state_of = {node_of(state).pk: state for _, state, _ in started.values()}
    # each replica's server log (vLLM's access log included) lives in its agent's state
    log_of = {r.server_id: state_of[r.node_id] / "work" / "endpoints" / f"endpoint-{r.server_id}.log" for r in replicas}
    token = Token.objects.create(user=user)
    auth = {"Authorization": f"Token {token.key}", "Host": endpoint.hostname}

    def complete() -> None:
        answer = requests.post(
            f"{control_plane.url}/v1/completions",
            headers=auth,
            json={"model": MODEL, "prompt": "the fleet runs", "max_tokens": 4, "temperature": 0},
            timeout=300,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["text"] is not None

    def served() -> dict[str, int]:
        return {sid: path.read_text(errors="replace").count("POST /v1/completions") for sid, path in log_of.items()}

    for _ in range(4):
        complete()
    assert all(count >= 1 for count in served().values()), served()

    proc, state_a, _ = started["cpu-a"]
    proc.kill()  # its tunnel goes; its vLLM server (a session of its own) keeps running, unreachable
    survivor = next(r.server_id for r in replicas.all() if r.node_id != node_of(state_a).pk)
    before = served()
    for _ in range(3):
        complete()
    after = served()
    assert after[survivor] - before[survivor] == 3


def test_real_vllm_takes_the_server_arguments_scales_to_zero_and_starts_cold_on_a_request(
    control_plane, cluster, operator, agents, hub, engine_python, tiny_model, settings
):
    """vLLM itself honours the endpoint's server arguments (its model list reports the max_model_len given);
    idle, the endpoint scales to zero (vLLM's whole process tree ends), and one request waits through vLLM's
    cold start and is answered by it."""
    from fleet.workloads.models import EndpointReplica
    from fleet.workloads.tasks import endpoints_heal_tick, endpoints_idle_tick

    user, _ = operator
    hub.add_repo(MODEL, tiny_model)
    env = {"CLEVERTHIS_VLLM_CPU_PYTHON": engine_python, "PYTHONPATH": str(REPO_ROOT)}
    _, state, _ = agents(control_plane, cluster, user, "cpu", extra_env=env)
    node = node_of(state)
    wait_status(node, "online")
    (download,) = services.command_dispatch(
        actor=user, cluster=cluster, command_type="model.download", payload={"model_id": MODEL}, node=node
    )
    wait_until(lambda: Command.objects.get(pk=download.pk).status == "succeeded", timeout=120, what="download")
    endpoint = workload_services.endpoint_create(
        actor=user,
        cluster=cluster,
        model_id=MODEL,
        min_replicas=0,
        idle_timeout_s=1,
        server_args=["--max-model-len", "96"],
    )
    up = ("running", "failed")
    wait_until(lambda: Endpoint.objects.get(pk=endpoint.pk).status in up, timeout=900, interval=1, what="vLLM up")
    endpoint.refresh_from_db()
    assert endpoint.status == "running", endpoint.failure_message
    token = Token.objects.create(user=user)
    auth = {"Authorization": f"Token {token.key}", "Host": endpoint.hostname}
    models = requests.get(f"{control_plane.url}/v1/models", headers=auth, timeout=60).json()["data"]
    assert [(m["owned_by"], m["max_model_len"]) for m in models] == [("vllm", 96)]  # the real engine, our args
    tree = server_tree(state, endpoint)

    # quiet for its idle timeout: scaled to zero, the server stopped once drained
    wait_until(lambda: endpoints_idle_tick() == [str(endpoint.pk)], timeout=60, interval=0.5, what="the idle pass")
    settings.ENDPOINT_DRAIN_S = 0
    endpoints_heal_tick()
    (replica,) = EndpointReplica.objects.filter(endpoint=endpoint)
    wait_until(lambda: EndpointReplica.objects.get(pk=replica.pk).status == "stopped", timeout=120, what="stopped")
    wait_until(lambda: not any(p.is_running() for p in tree), timeout=60, what="vLLM's processes gone")
    assert Endpoint.objects.get(pk=endpoint.pk).status == "idle"

    # one request wakes it: it waits while vLLM starts and loads, then vLLM answers it (on very busy cores
    # vLLM may need longer than the wait's bound, ENDPOINT_COLD_START_S: then it says so, and a retry waits on)
    asked = time.monotonic()
    while True:
        completion = requests.post(
            f"{control_plane.url}/v1/completions",
            headers=auth,
            json={"model": MODEL, "prompt": "the fleet runs", "max_tokens": 4, "temperature": 0},
            timeout=900,
        )
        timed_out = completion.status_code == 503 and "cold_start_timeout" in completion.text
        if not timed_out or time.monotonic() - asked > 900:
            break
        assert completion.headers["retry-after"]
    assert completion.status_code == 200, completion.text
    assert completion.json()["usage"]["completion_tokens"] == 4
    print(f"cold start: {time.monotonic() - asked:.0f} s from the request to vLLM's answer")
    assert Endpoint.objects.get(pk=endpoint.pk).status == "running"

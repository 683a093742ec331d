"""Real vLLM (the CPU build) serving LoRA adapters, and its starts explained, end to end with real processes.

A tiny Llama (`tests.support.tiny_llm`) and a LoRA adapter made for it (`tests.support.tiny_lora`) are published
through the Hub stand-in; a second adapter lies in a folder on the node. A cold start (the node has no weights:
endpoint.start fetches them) with `--enable-lora` → two adapters attached while it runs are loaded by vLLM's
runtime API without a restart: `/v1/models` through the endpoint's URL lists them, a request naming one is
answered by it (greedy text unlike the base model's) and metered for the adapter; one detached is unloaded (vLLM
answers 404 for it). A restart is a warm start (weights cached) that loads the attached adapter as it starts.
Both starts' phases are on the endpoint's log and in /metrics.
"""

from __future__ import annotations

import os
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.authtoken.models import Token

from fleet import services
from fleet.models import Command
from fleet.usage.models import UsageRollup
from fleet.workloads import services as workload_services
from fleet.workloads.models import Endpoint, EndpointEvent, EndpointReplica
from tests.e2e import test_vllm_endpoint
from tests.e2e.conftest import node_of, wait_status
from tests.support.live import ControlPlane, subprocess_env
from tests.support.processes import REPO_ROOT, wait_until
from tests.support.tiny_lora import build as build_lora

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True), pytest.mark.timeout(1800)]

MODEL = "acme/tiny-llama"
ADAPTER_REPO = "acme/tiny-llama-tone-lora"
TOKEN = "lora-metrics-token"
engine_python = test_vllm_endpoint.engine_python  # the CPU engine's python, and the tiny Llama: its fixtures
tiny_model = test_vllm_endpoint.tiny_model
LORA_ARGS = ["--enable-lora", "--max-lora-rank", "8", "--max-loras", "2", "--max-model-len", "256"]


@pytest.fixture
def control_plane(tmp_path, settings):
    """One web replica and a worker that answer /metrics (its multiprocess files in the test's folder)."""
    settings.NODE_OFFLINE_AFTER_S = 3
    env = subprocess_env(NODE_OFFLINE_AFTER_S="3", METRICS_TOKEN=TOKEN, PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "m"))
    plane = ControlPlane(log_dir=tmp_path, env=env)
    plane.start_replica()
    plane.start_worker()
    yield plane
    plane.stop()


def phases_events(endpoint: Endpoint) -> list[EndpointEvent]:
    return list(EndpointEvent.objects.filter(endpoint=endpoint, kind="endpoint.start_phases").order_by("created_at"))


def replica_adapters(endpoint: Endpoint) -> list[str]:
    return sorted(EndpointReplica.objects.get(endpoint=endpoint, status="running").adapters)


def served(base: str, auth: dict[str, str]) -> dict[str, str | None]:
    """{model id: its parent} of the endpoint's /v1/models (an adapter's parent is the base model)."""
    response = requests.get(f"{base}/v1/models", headers=auth, timeout=60)
    assert response.status_code == 200, response.text
    return {m["id"]: m.get("parent") for m in response.json()["data"]}


def complete(base: str, auth: dict[str, str], model: str) -> requests.Response:
    body = {"model": model, "prompt": "the fleet runs", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    return requests.post(f"{base}/v1/completions", headers=auth, json=body, timeout=120)


def histogram_count(url: str, phase: str, weights: str) -> float:
    text = requests.get(f"{url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "cleverthis_endpoint_start_phase_seconds_count"
        and sample.labels == {"phase": phase, "weights": weights}
    )


def test_lora_adapters_on_real_vllm_and_cold_start_phases(
    control_plane, cluster, operator, agents, hub, engine_python, tiny_model, tmp_path
):
    user, workspace = operator
    hub.add_repo(MODEL, tiny_model)
    hub.add_repo(ADAPTER_REPO, build_lora(tmp_path / "tone", engine_python, seed=1))
    build_lora(tmp_path / "terse", engine_python, seed=2)  # an adapter as a folder on the node
    env = {"CLEVERTHIS_VLLM_CPU_PYTHON": engine_python, "PYTHONPATH": str(REPO_ROOT)}
    _, state, _ = agents(control_plane, cluster, user, "lora", extra_env=env)
    node = node_of(state)
    wait_status(node, "online")

    # a cold start: the node has no weights, the start fetches them
    asked = time.monotonic()
    (start,) = services.command_dispatch(
        actor=user,
        cluster=cluster,
        command_type="endpoint.start",
        payload={"endpoint_id": "0a1b2c3d4e5f", "model_id": MODEL, "download": True, "extra_args": LORA_ARGS},
        node=node,
    )
    endpoint = Endpoint.objects.get(slug="0a1b2c3d4e5f")
    wait_until(lambda: Endpoint.objects.get(pk=endpoint.pk).status in ("running", "failed"), timeout=900, interval=1)
    endpoint.refresh_from_db()
    assert endpoint.status == "running", endpoint.failure_message
    print(f"cold start: {time.monotonic() - asked:.1f} s from the command to running")
    (cold,) = phases_events(endpoint)
    assert cold.data["weights"] == "downloaded"
    assert cold.data["weights_bytes"] == sum(len(b) for b in tiny_model.values())
    order = ["placed", "weights", "server_started", "model_loaded", "healthy", "total"]
    assert set(cold.data["phases"]) == set(order)  # (jsonb keeps no key order)
    assert cold.data["phases"]["model_loaded"] > 0  # vLLM logged its weights loaded before it answered
    assert cold.data["phases"]["total"] == pytest.approx(sum(cold.data["phases"][p] for p in order[:-1]), abs=0.01)
    print(f"cold start phases: {cold.message}")

    token = Token.objects.create(user=user)
    auth = {"Authorization": f"Token {token.key}", "Host": endpoint.hostname}
    base = control_plane.url
    assert served(base, auth) == {MODEL: None}
    base_text = complete(base, auth, MODEL).json()["choices"][0]["text"]

    # adapters attached while it runs: loaded by vLLM's runtime API, no restart
    pid = Command.objects.get(pk=start.pk).result["pid"]
    tone = workload_services.lora_adapter_create(actor=user, workspace=workspace, name="tone", model_id=ADAPTER_REPO)
    terse = workload_services.lora_adapter_create(
        actor=user, workspace=workspace, name="terse", path=str(tmp_path / "terse")
    )
    workload_services.endpoint_adapter_attach(actor=user, endpoint=endpoint, adapter=tone)
    workload_services.endpoint_adapter_attach(actor=user, endpoint=endpoint, adapter=terse)
    wait_until(lambda: replica_adapters(endpoint) == ["terse", "tone"], timeout=120, what="adapters loaded")
    assert served(base, auth) == {MODEL: None, "tone": MODEL, "terse": MODEL}
    assert Command.objects.filter(command_type="endpoint.start", node=node).count() == 1  # no restart
    assert os.path.exists(f"/proc/{pid}")

    answered = complete(base, auth, "tone")
    assert answered.status_code == 200, answered.text
    assert answered.json()["model"] == "tone"
    assert answered.json()["choices"][0]["text"] != base_text  # the adapter's weights changed the greedy answer
    usage = answered.json()["usage"]

    def adapter_rows() -> list[UsageRollup]:
        return list(UsageRollup.objects.filter(granularity="minute", subject_kind="adapter", subject_id=tone.pk))

    wait_until(lambda: sum(r.requests for r in adapter_rows()) == 1, timeout=30, what="adapter usage written")
    assert [(r.prompt_tokens, r.completion_tokens) for r in adapter_rows()] == [
        (usage["prompt_tokens"], usage["completion_tokens"])
    ]
    assert not UsageRollup.objects.filter(subject_kind="adapter", subject_id=terse.pk).exists()

    # detached: unloaded, and vLLM no longer knows it
    workload_services.endpoint_adapter_detach(actor=user, endpoint=endpoint, adapter=tone)
    wait_until(lambda: replica_adapters(endpoint) == ["terse"], timeout=120, what="adapter unloaded")
    assert served(base, auth) == {MODEL: None, "terse": MODEL}
    assert complete(base, auth, "tone").status_code == 404

    # a warm start (the weights are cached now): the attached adapter is loaded as it starts
    workload_services.endpoint_stop(actor=user, endpoint=endpoint)
    wait_until(lambda: Endpoint.objects.get(pk=endpoint.pk).status == "stopped", timeout=120, what="stopped")
    asked = time.monotonic()
    workload_services.endpoint_restart(actor=user, endpoint=endpoint)
    wait_until(lambda: Endpoint.objects.get(pk=endpoint.pk).status in ("running", "failed"), timeout=900, interval=1)
    endpoint.refresh_from_db()
    assert endpoint.status == "running", endpoint.failure_message
    print(f"warm start: {time.monotonic() - asked:.1f} s from the restart to running")
    _, warm = phases_events(endpoint)
    assert warm.data["weights"] == "present"
    assert set(warm.data["phases"]) == {*order, "adapters"}
    print(f"warm start phases: {warm.message}")
    assert replica_adapters(endpoint) == ["terse"]
    assert served(base, auth) == {MODEL: None, "terse": MODEL}
    assert complete(base, auth, "terse").json()["model"] == "terse"

    assert histogram_count(base, "total", "downloaded") == 1
    assert histogram_count(base, "total", "present") == 1
    assert histogram_count(base, "adapters", "present") == 1

    workload_services.endpoint_stop(actor=user, endpoint=endpoint)
    wait_until(lambda: Endpoint.objects.get(pk=endpoint.pk).status == "stopped", timeout=120, what="stopped")

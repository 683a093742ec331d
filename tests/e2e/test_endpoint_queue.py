"""Held, not refused, at saturation, end to end: an endpoint on a real agent, called through the control plane's
tunnel proxy by real HTTP clients. Its server (the OpenAI-compatible stand-in `tests.support.openai_standin`,
which holds each answer for the `standin_delay_s` a request asks and reports the most requests it served at
once) never serves more than the endpoint's concurrency limit, taken from its `--max-num-seqs`; the requests
over it wait in the endpoint's queue, served round-robin over API keys (a key with many queued does not starve
another); past the queue's depth or its wait bound a request gets 429 with Retry-After and a JSON reason,
and nothing is answered 5xx. Two web processes share the limit (one sees what the other has in flight), and
the same queue holds requests while an endpoint scaled to zero starts again.

vLLM's concurrency limit itself is not what is tested (the proxy's is): the stand-in answers like vLLM and
counts what it serves at once.
"""

from __future__ import annotations

import concurrent.futures
import sys
import threading
import time

import pytest
import requests

from fleet import services
from fleet.models import Command
from fleet.replica_load import QueueLoad
from fleet.workloads import selectors
from fleet.workloads import services as workload_services
from fleet.workloads.models import Endpoint, EndpointReplica, EndpointStatus
from fleet.workloads.tasks import endpoints_heal_tick, endpoints_idle_tick
from tests.e2e.conftest import node_of, wait_status
from tests.support.processes import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def node(control_plane, cluster, operator, agents):
    """One agent serving the stand-in, with acme/tiny downloaded."""
    user, _ = operator
    # (each start takes 3 s, as a model load takes time: long enough to see requests wait through a cold start)
    server = {"CLEVERTHIS_ENDPOINT_SERVER": f"{sys.executable} -m tests.support.openai_standin --start-delay-s 3"}
    _, state, _ = agents(control_plane, cluster, user, "gpu-a", extra_env=server)
    found = node_of(state)
    wait_status(found, "online")
    (download,) = services.command_dispatch(
        actor=user, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}, node=found
    )
    wait_until(lambda: Command.objects.get(pk=download.pk).status == "succeeded", timeout=60, what="download")
    return found


def running(endpoint: Endpoint) -> Endpoint:
    wait_until(
        lambda: Endpoint.objects.get(pk=endpoint.pk).status == EndpointStatus.RUNNING, timeout=60, what="running"
    )
    return Endpoint.objects.get(pk=endpoint.pk)


def key_of(user, cluster, name: str) -> str:
    _, secret = workload_services.api_key_create(actor=user, workspace=cluster.workspace, name=name, scopes=["invoke"])
    return secret


class Caller:
    """Posts chat completions to an endpoint through a web process; notes each answer in completion order."""

    def __init__(self, url: str, endpoint: Endpoint) -> None:
        self.url, self.host = url, endpoint.hostname
        self.done: list[tuple[str, requests.Response]] = []
        self.lock = threading.Lock()

    def post(self, key: str, tag: str, delay_s: float = 0.0, url: str | None = None) -> requests.Response:
        answer = requests.post(
            f"{url or self.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}", "Host": self.host},
            json={"model": "acme/tiny", "messages": [{"role": "user", "content": tag}], "standin_delay_s": delay_s},
            timeout=120,
        )
        with self.lock:
            self.done.append((tag, answer))
        return answer


def statuses(answers) -> list[int]:
    return sorted(a.status_code for a in answers)


def peak(answers) -> int:
    return max(int(a.headers.get("x-peak-concurrency", 0)) for a in answers if a.status_code == 200)


def test_requests_over_the_limit_wait_their_turn_round_robin_over_keys(control_plane, cluster, operator, node):
    user, _ = operator
    endpoint = workload_services.endpoint_create(
        actor=user, cluster=cluster, model_id="acme/tiny", server_args=["--max-num-seqs", "2"]
    )
    endpoint = running(endpoint)
    assert endpoint.concurrency_limit == 2  # from the server's arguments
    greedy, polite = key_of(user, cluster, "greedy"), key_of(user, cluster, "polite")
    caller = Caller(control_plane.url, endpoint)
    assert caller.post(greedy, "warm-up").status_code == 200
    caller.done.clear()
    with concurrent.futures.ThreadPoolExecutor(max_workers=12) as pool:
        flood = [pool.submit(caller.post, greedy, f"greedy-{i}", 1.0) for i in range(10)]

        def queued() -> int:
            return (selectors.queue_loads().get(str(endpoint.pk)) or QueueLoad()).waiting

        wait_until(lambda: queued() >= 6, timeout=30, interval=0.05, what="the greedy key's requests queued")
        late = [pool.submit(caller.post, polite, f"polite-{i}", 1.0) for i in range(2)]
        answers = [f.result() for f in [*flood, *late]]
    assert statuses(answers) == [200] * 12  # 6x the limit: every request answered, none refused
    assert peak(answers) <= 2  # the server never served more than the limit at once
    order = [tag for tag, _ in caller.done]
    polite_at = [order.index(f"polite-{i}") for i in range(2)]
    assert max(polite_at) <= 7, order  # first in, first out would answer them last (10th and 11th of 0..11)
    figures = selectors.queue_loads()[str(endpoint.pk)]
    assert figures.admitted >= 12
    assert figures.wait_p99_s > 0  # some waited (the API, the page and /metrics show the same figures)


def test_past_the_queue_s_depth_or_wait_bound_a_request_gets_429_and_nothing_5xx(
    control_plane, cluster, operator, node
):
    user, _ = operator
    endpoint = workload_services.endpoint_create(
        actor=user, cluster=cluster, model_id="acme/tiny", max_concurrency=2, queue_max_depth=2, queue_max_wait_s=30
    )
    endpoint = running(endpoint)
    key = key_of(user, cluster, "k")
    caller = Caller(control_plane.url, endpoint)
    assert caller.post(key, "warm-up").status_code == 200
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:  # twice the capacity: 2 in flight + 2 queued
        answers = list(pool.map(lambda i: caller.post(key, f"r{i}", 1.5), range(8)))
    codes = statuses(answers)
    assert set(codes) <= {200, 429}  # zero 5xx
    assert codes.count(200) >= 4
    assert codes.count(429) >= 2
    for refused in (a for a in answers if a.status_code == 429):
        assert int(refused.headers["retry-after"]) >= 1
        error = refused.json()["error"]
        assert error["type"] == "queue_full"
        assert error["retry_after"] == int(refused.headers["retry-after"])
    assert peak(answers) <= 2

    workload_services.endpoint_set_admission(
        actor=user, endpoint=endpoint, max_concurrency=1, queue_max_depth=10, queue_max_wait_s=1
    )
    time.sleep(2.5)  # (the web process re-reads the route within PROXY_ROUTE_CACHE_S, 2 s)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        slow = pool.submit(caller.post, key, "holds the slot", 4.0)
        wait_until(lambda: _in_flight(endpoint) >= 1, timeout=10, interval=0.05, what="busy")
        late = pool.submit(caller.post, key, "waits too long")
        assert late.result().status_code == 429
        assert late.result().json()["error"]["type"] == "queue_timeout"
        assert int(late.result().headers["retry-after"]) >= 1
        assert slow.result().status_code == 200


def _in_flight(endpoint: Endpoint) -> int:
    loads = selectors.replica_loads()
    return sum(loads[r.server_id].in_flight for r in endpoint.replicas.all() if r.server_id in loads)


def test_two_web_processes_share_the_limit(control_plane, cluster, operator, node):
    user, _ = operator
    second = f"http://127.0.0.1:{control_plane.start_replica()}"
    endpoint = running(
        workload_services.endpoint_create(actor=user, cluster=cluster, model_id="acme/tiny", max_concurrency=2)
    )
    key = key_of(user, cluster, "k")
    caller = Caller(control_plane.url, endpoint)
    for url in (control_plane.url, second):  # (each process starts publishing its figures)
        assert caller.post(key, "warm-up", url=url).status_code == 200
    with concurrent.futures.ThreadPoolExecutor(max_workers=6) as pool:
        long = [pool.submit(caller.post, key, f"first-{i}", 3.0) for i in range(2)]  # the limit, taken in web 0
        wait_until(lambda: _in_flight(endpoint) == 2, timeout=10, interval=0.05, what="web 0's load published")
        time.sleep(1.5)  # (web 1 reads the shared figures in the background, every second)
        short = [pool.submit(caller.post, key, f"second-{i}", 0.2, second) for i in range(4)]

        def waiting() -> int:
            return (selectors.queue_loads().get(str(endpoint.pk)) or QueueLoad()).waiting

        wait_until(lambda: waiting() >= 1, timeout=10, interval=0.05, what="web 1's requests queued")
        answers = [f.result() for f in [*long, *short]]
    assert statuses(answers) == [200] * 6
    assert max(int(a.headers["x-concurrent"]) for a in answers) <= 2  # web 1 waited for web 0's slots


def test_the_queue_holds_requests_through_a_cold_start(control_plane, cluster, operator, node, settings):
    user, _ = operator
    endpoint = workload_services.endpoint_create(
        actor=user, cluster=cluster, model_id="acme/tiny", min_replicas=0, idle_timeout_s=1, queue_max_depth=3
    )
    endpoint = running(endpoint)
    key = key_of(user, cluster, "k")
    caller = Caller(control_plane.url, endpoint)
    assert caller.post(key, "warm-up").status_code == 200
    (first,) = EndpointReplica.objects.filter(endpoint=endpoint)
    wait_until(lambda: endpoints_idle_tick() == [str(endpoint.pk)], timeout=30, interval=0.5, what="the idle pass")
    settings.ENDPOINT_DRAIN_S = 0
    endpoints_heal_tick()
    wait_until(
        lambda: EndpointReplica.objects.get(pk=first.pk).status == EndpointStatus.STOPPED, timeout=60, what="stopped"
    )
    assert Endpoint.objects.get(pk=endpoint.pk).status == EndpointStatus.IDLE
    time.sleep(2.5)  # (the web process's cached route says idle)

    with concurrent.futures.ThreadPoolExecutor(max_workers=5) as pool:
        held = [pool.submit(caller.post, key, f"held-{i}") for i in range(3)]

        def waiting() -> int:
            return (selectors.queue_loads().get(str(endpoint.pk)) or QueueLoad()).waiting

        wait_until(lambda: waiting() == 3, timeout=30, interval=0.05, what="3 waiting through the cold start")
        over = [pool.submit(caller.post, key, f"over-{i}") for i in range(2)]
        refused = [f.result() for f in over]
        answers = [f.result() for f in held]
    assert statuses(refused) == [429, 429]  # the queue's depth counts the requests waiting for the start
    assert all(r.json()["error"]["type"] == "queue_full" for r in refused)
    assert statuses(answers) == [200] * 3
    assert Endpoint.objects.get(pk=endpoint.pk).status == EndpointStatus.RUNNING

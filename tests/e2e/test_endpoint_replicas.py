"""An endpoint of two replicas on two real agents, through the control plane's tunnel proxy: requests
spread over both servers; once one agent dies every request is still answered, by the other; once its node
is offline the healing pass starts a replacement (on the surviving node, the only other one holding the
model) and requests spread over both servers again.

vLLM cannot run here (its wheel pins a CUDA torch): each agent starts the OpenAI-compatible stand-in
`tests.support.openai_standin`, which names the server that answered (`X-Served-By`).
"""

from __future__ import annotations

import sys

import pytest
import requests
from rest_framework.authtoken.models import Token

from fleet import services
from fleet.models import Command
from fleet.workloads import services as workload_services
from fleet.workloads.models import EndpointReplica, EndpointStatus
from fleet.workloads.tasks import endpoints_heal_tick
from tests.e2e.conftest import node_of, wait_status
from tests.support.processes import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_requests_spread_over_replicas_and_survive_an_agent_dying(control_plane, cluster, operator, agents):
    user, _ = operator
    server = {"CLEVERTHIS_ENDPOINT_SERVER": f"{sys.executable} -m tests.support.openai_standin"}
    started = {name: agents(control_plane, cluster, user, name, extra_env=server) for name in ("gpu-a", "gpu-b")}
    nodes = {name: node_of(state) for name, (_, state, _) in started.items()}
    for node in nodes.values():
        wait_status(node, "online")
        (download,) = services.command_dispatch(
            actor=user, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}, node=node
        )
        wait_until(lambda d=download: Command.objects.get(pk=d.pk).status == "succeeded", timeout=60, what="download")
    endpoint = workload_services.endpoint_create(actor=user, cluster=cluster, model_id="acme/tiny", min_replicas=2)
    replicas = EndpointReplica.objects.filter(endpoint=endpoint)
    wait_until(
        lambda: {r.status for r in replicas.all()} <= {EndpointStatus.RUNNING, EndpointStatus.FAILED},
        timeout=60,
        what="both replicas up",
    )
    assert [r.status for r in replicas.all()] == [EndpointStatus.RUNNING] * 2, [r.failure_message for r in replicas]
    served_by = {r.node_id: f"127.0.0.1:{r.port}" for r in replicas.all()}
    assert set(served_by) == {node.pk for node in nodes.values()}  # one replica on each node

    token = Token.objects.create(user=user)
    auth = {"Authorization": f"Token {token.key}", "Host": endpoint.hostname}

    def ask() -> requests.Response:
        answer = requests.post(
            f"{control_plane.url}/v1/chat/completions",
            headers=auth,
            json={"model": "acme/tiny", "messages": [{"role": "user", "content": "which one"}]},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "echo: which one"
        return answer

    assert {ask().headers["x-served-by"] for _ in range(6)} == set(served_by.values())

    proc, _, _ = started["gpu-a"]
    proc.kill()  # its tunnel goes; its server (a session of its own) keeps running, unreachable
    survivor = served_by[nodes["gpu-b"].pk]
    assert [ask().headers["x-served-by"] for _ in range(6)] == [survivor] * 6
    wait_status(nodes["gpu-a"], "offline")  # and once the node is offline its replica is out of rotation
    assert [ask().headers["x-served-by"] for _ in range(4)] == [survivor] * 4

    assert endpoints_heal_tick() == {str(endpoint.pk): 1}  # the beat's healing pass
    lost = replicas.get(node=nodes["gpu-a"])
    new = replicas.get(replacement_of=lost)
    assert new.node_id == nodes["gpu-b"].pk
    wait_until(
        lambda: EndpointReplica.objects.get(pk=new.pk).status in (EndpointStatus.RUNNING, EndpointStatus.FAILED),
        timeout=60,
        what="the replacement up",
    )
    new.refresh_from_db()
    assert new.status == EndpointStatus.RUNNING, new.failure_message
    assert EndpointReplica.objects.get(pk=lost.pk).status == EndpointStatus.STOPPING  # waits for gpu-a's return
    fresh = f"127.0.0.1:{new.port}"
    wait_until(lambda: ask().headers["x-served-by"] == fresh, timeout=10, what="the replacement in rotation")
    assert {ask().headers["x-served-by"] for _ in range(6)} == {survivor, fresh}

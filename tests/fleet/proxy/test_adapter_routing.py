"""A request naming one of an endpoint's LoRA adapters goes, through the real relay and stand-in tunnels, to a
replica that has it loaded (any replica while none has), and its usage counts for the adapter too."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from fleet import balancer
from fleet.proxy import affinity, relay, resolvers
from fleet.usage import meter
from tests.fleet.proxy.test_balancer import agents, status_of  # noqa: F401  (the stand-in agents fixture)


@pytest.fixture(autouse=True)
def _no_leftover_counts():
    balancer._outstanding.clear()
    balancer.discard()
    yield
    balancer._outstanding.clear()
    balancer.discard()
    meter.discard()


async def post(target: resolvers.ProxyTarget, model: str, usage: meter.RequestUsage | None = None) -> int:
    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 4}).encode()
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "query_string": b""}
    scope["headers"] = [(b"content-length", str(len(body)).encode())]
    await asyncio.wait_for(relay.proxy_http(scope, receive, send, target, usage=usage), timeout=30)
    return status_of(sent)


def test_the_requested_model_is_read_from_the_body():
    assert affinity.requested_model(b'{"model": "tone", "prompt": "x"}') == "tone"
    assert affinity.requested_model(b'{"prompt": "x"}') is None
    assert affinity.requested_model(b"not json") is None


@pytest.mark.asyncio
async def test_a_request_naming_an_adapter_goes_to_a_replica_holding_it(agents):  # noqa: F811
    made = [agents("answer") for _ in range(3)]
    replicas = tuple(u for u, _ in made)
    tone, fresh = uuid.uuid4(), uuid.uuid4()
    holder = replicas[2]
    target = resolvers.ProxyTarget(
        node_id=replicas[0].node_id,
        port=replicas[0].port,
        path="/v1/completions",
        replicas=replicas,
        adapters={"tone": (tone, frozenset({holder.key})), "fresh": (fresh, frozenset())},
    )

    def served() -> list[int]:
        return [len(agent.openings) for _, agent in made]

    for _ in range(6):
        assert await post(target, "tone") == 200
    assert served() == [0, 0, 6]  # only the replica that has it loaded
    for _ in range(6):
        assert await post(target, "acme/base") == 200
    assert sum(served()[:2]) >= 2  # the base model: spread by load over every replica
    before = served()
    for _ in range(3):
        assert await post(target, "fresh") == 200  # loaded nowhere yet: any replica answers (vLLM's 404 or it)
    assert sum(served()) - sum(before) == 3

    usage = meter.RequestUsage(meter.Subject(uuid.uuid4(), uuid.uuid4()), None)
    assert await post(target, "tone", usage) == 200
    assert usage.adapter == tone
    assert usage.replica == holder.key

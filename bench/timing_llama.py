"""A timing-realistic random-weight Llama for serving benches: built with the vLLM virtualenv's python.

    <vllm python> -m bench.timing_llama <folder>   (from the repository's root)

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

VOCAB = 32_000
MAX_POSITIONS = 4_096
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|> {{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]


def vocabulary() -> list[str]:
    from fleet.workloads.loadgen import WORDS

    words = [*SPECIAL, *dict.fromkeys(WORDS), *(str(n) for n in range(10_000))]
    words += [f"w{n}" for n in range(VOCAB - len(words))]
    return words


def make(folder: Path) -> None:  # runs in the vLLM virtualenv
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from tests.support.tiny_llm import save_random_llama

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
    save_random_llama(folder, fast, hidden=256, intermediate=768, layers=6, heads=8, max_positions=MAX_POSITIONS)


def build(folder: Path, python: str) -> dict[str, bytes]:
    """Make the model in `folder` with `python` (the vLLM virtualenv's); its files by relative path."""
    from tests.support.tiny_llm import build as build_model

    return build_model(folder, python, maker="bench.timing_llama", timeout=900)


if __name__ == "__main__":
    make(Path(sys.argv[1]))

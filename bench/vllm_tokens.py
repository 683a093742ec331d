"""Tokens per second of an OpenAI-compatible server (vLLM), at concurrency 1 and 8.

    .venv/bin/python bench/vllm_tokens.py http://127.0.0.1:8000 --model acme/tiny-llama
    .venv/bin/python bench/vllm_tokens.py http://127.0.0.1:8000 --model m --host endpoint-<slug>.endpoints.localhost \
        --token <API token>      # through the control plane's endpoint URL (daphne + tunnel)

Each request is `/v1/completions` with `max_tokens` generated tokens (`ignore_eos`, temperature 0);
printed: generated tokens per second over the whole batch (completion tokens / wall time) per
concurrency. `measure()` is also called by the real-vLLM e2e test to print direct vs proxied figures.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import requests


def measure(
    base: str,
    model: str,
    *,
    concurrency: int,
    requests_per_worker: int = 3,
    max_tokens: int = 64,
    headers: dict[str, str] | None = None,
) -> float:
    """Generated tokens per second with `concurrency` clients each sending `requests_per_worker` requests."""
    body = {"model": model, "prompt": "the fleet runs", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}

    def worker(_: int) -> int:
        tokens = 0
        with requests.Session() as session:
            for _ in range(requests_per_worker):
                response = session.post(f"{base}/v1/completions", json=body, headers=headers or {}, timeout=300)
                response.raise_for_status()
                tokens += response.json()["usage"]["completion_tokens"]
        return tokens

    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        total = sum(pool.map(worker, range(concurrency)))
    return total / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base")
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="")
    parser.add_argument("--token", default="")
    args = parser.parse_args()
    headers = {}
    if args.host:
        headers["Host"] = args.host
    if args.token:
        headers["Authorization"] = f"Token {args.token}"
    measure(args.base, args.model, concurrency=1, requests_per_worker=1, headers=headers)  # warm up
    for concurrency in (1, 8):
        rate = measure(args.base, args.model, concurrency=concurrency, headers=headers)
        print(f"concurrency {concurrency}: {rate:,.0f} tokens/s")


if __name__ == "__main__":
    main()

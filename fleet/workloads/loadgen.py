"""A small asyncio load generator for OpenAI-compatible chat endpoints, streaming, with TTFT and inter-token times.

No Django here: the benchmark task (`services.benchmarks`) and the serving bench (`bench/routing_policies.py`)
both run it. `concurrency` clients each send streamed `/v1/chat/completions` back to back until `duration_s`
has passed (a request under way then is finished and counted) or, with `conversations` set, until that many
conversations are done. A prompt is `prompt_tokens` random words (one word is about one token); with `turns` > 1
a client holds a conversation: each turn resends the history (its earlier prompts and answers) plus a new
prompt, as chat and agent traffic does, after a pause of up to 2 x `think_s`; `system_tokens` puts one system
prompt of that many words, shared by every conversation, in front. Each request asks for `output_tokens` tokens
(`ignore_eos`, as vLLM honours) and for its usage (`stream_options.include_usage`): tokens counted are what the
server reported.

Per request: TTFT (until the first content), the gaps between content chunks (inter-token latency: vLLM sends
one token a chunk), tokens, the status and, for a 429, its `Retry-After`. `summarise` turns them into the report
(p50/p99, tokens/s, requests/s, errors by kind, a per-second series for the charts).

Why our own and not aiperf, guidellm or inference-perf (all on PyPI): each needs the model's tokenizer
(downloaded from the Hub at run time, which the workers may not reach) and many dependencies (transformers,
zmq, a process per worker) the control plane does not carry; what a benchmark reports here needs only the
server's own token counts.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

WORDS = (
    "the fleet runs models on nodes that dial out to a control plane through one tunnel and serve completions "
    "tokens streams endpoints clusters workers heads jobs replicas routes queues caches prefixes sessions keys"
).split()
REQUEST_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class LoadSpec:
    """What to send (see the module's docstring)."""

    model: str
    concurrency: int
    prompt_tokens: int
    output_tokens: int
    duration_s: float
    turns: int = 1
    system_tokens: int = 0
    conversations: int | None = None  # stop after this many conversations (else at duration_s)
    session_header: bool = False  # send X-Session-Id: the conversation's id
    think_s: float = 0.0  # between a conversation's turns, a pause of 0 to 2 x think_s (a user reading, typing)
    seed: int = 0


@dataclass
class Outcome:
    """One request: when it started (s after the run began), its figures, and why it failed ("" if it did not)."""

    started: float
    conversation: int
    turn: int
    status: int = 0
    ttft: float | None = None
    latency: float | None = None
    itls: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    output_tokens: int = 0
    retry_after: str | None = None
    error: str = ""


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def _one(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict[str, Any], outcome: Outcome
) -> str:
    """Send one streamed request, filling `outcome`; the answer's text."""
    text: list[str] = []
    sent = time.monotonic()
    last = None
    try:
        async with client.stream("POST", url, json=body, headers=headers, timeout=REQUEST_TIMEOUT_S) as answer:
            outcome.status = answer.status_code
            if answer.status_code != 200:
                outcome.retry_after = answer.headers.get("retry-after")
                outcome.error = f"HTTP {answer.status_code}: {(await answer.aread())[:200].decode(errors='replace')}"
                return ""
            done = False
            async for line in answer.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    outcome.prompt_tokens = chunk["usage"].get("prompt_tokens") or 0
                    outcome.output_tokens = chunk["usage"].get("completion_tokens") or 0
                choices = chunk.get("choices") or [{}]
                content = (choices[0].get("delta") or {}).get("content")
                if content:
                    now = time.monotonic()
                    if last is None:
                        outcome.ttft = now - sent
                    else:
                        outcome.itls.append(now - last)
                    last = now
                    text.append(content)
            if not done:
                outcome.error = "stream ended without [DONE]"
    except (httpx.HTTPError, ValueError, OSError) as exc:  # every failure is a failed request here
        outcome.error = f"{type(exc).__name__}: {exc}"
    outcome.latency = time.monotonic() - sent
    if outcome.ttft is not None and not outcome.output_tokens:
        outcome.output_tokens = len(outcome.itls) + 1  # no usage chunk: count the content chunks
    return "".join(text)


async def run(
    url: str,
    headers: dict[str, str],
    spec: LoadSpec,
    *,
    on_progress: Callable[[int], None] | None = None,
    extra_body: dict[str, Any] | None = None,
) -> tuple[list[Outcome], float]:
    """Run `spec` against `url` (the endpoint's base URL, `/v1/chat/completions` is added); the outcomes and the
    run's length in seconds. `on_progress(requests finished)` is called about once a second."""
    rng = random.Random(spec.seed)
    system = _words(rng, spec.system_tokens) if spec.system_tokens else ""
    outcomes: list[Outcome] = []
    t0 = time.monotonic()
    deadline = t0 + spec.duration_s
    counter = iter(range(10**9))
    limits = httpx.Limits(max_connections=spec.concurrency, max_keepalive_connections=spec.concurrency)

    def more() -> int | None:
        if time.monotonic() >= deadline:
            return None
        number = next(counter)
        return None if spec.conversations is not None and number >= spec.conversations else number

    async def client_loop(client: httpx.AsyncClient) -> None:
        while (conversation := more()) is not None:
            local = random.Random(f"{spec.seed}-{conversation}")
            history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
            for turn in range(spec.turns):
                if turn and spec.conversations is None and time.monotonic() >= deadline:
                    break
                history.append(
                    {"role": "user", "content": f"{conversation} {turn} " + _words(local, spec.prompt_tokens)}
                )
                body = {
                    "model": spec.model,
                    "messages": history,
                    "max_tokens": spec.output_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                    **(extra_body or {}),
                }
                call_headers = {**headers, **({"X-Session-Id": f"c{conversation}"} if spec.session_header else {})}
                outcome = Outcome(started=time.monotonic() - t0, conversation=conversation, turn=turn)
                answer = await _one(client, url.rstrip("/") + "/v1/chat/completions", call_headers, body, outcome)
                outcomes.append(outcome)
                if outcome.error:
                    break
                history.append({"role": "assistant", "content": answer})
                if spec.think_s and turn + 1 < spec.turns:
                    await asyncio.sleep(local.uniform(0, 2 * spec.think_s))

    async def report_progress() -> None:
        while True:
            await asyncio.sleep(1)
            if on_progress is not None:
                on_progress(len(outcomes))

    async with httpx.AsyncClient(limits=limits, http2=False) as client:
        reporter = asyncio.create_task(report_progress())
        try:
            await asyncio.gather(*(client_loop(client) for _ in range(spec.concurrency)))
        finally:
            reporter.cancel()
    return outcomes, time.monotonic() - t0


def pct(values: list[float], q: float) -> float | None:
    """The q-quantile (nearest rank below) of `values`, None when there are none."""
    return sorted(values)[int(q * (len(values) - 1))] if values else None


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


def summarise(outcomes: list[Outcome], elapsed: float) -> dict[str, Any]:
    """The report: counts, TTFT / inter-token / latency p50 and p99 (ms), tokens/s, requests/s, errors by kind,
    429s with Retry-After, and per second of the run the requests finished, output tokens and TTFT p50."""
    ok = [o for o in outcomes if not o.error]
    ttfts = [o.ttft for o in ok if o.ttft is not None]
    itls = [gap for o in ok for gap in o.itls]
    latencies = [o.latency for o in ok if o.latency is not None]
    output = sum(o.output_tokens for o in ok)
    errors: dict[str, int] = {}
    for o in outcomes:
        if o.error:
            kind = f"HTTP {o.status}" if o.status and o.status != 200 else o.error.split(":")[0]
            errors[kind] = errors.get(kind, 0) + 1
    seconds = max(1, int(elapsed + 0.999))
    series: dict[str, list[Any]] = {
        "requests": [0] * seconds,
        "tokens": [0] * seconds,
        "ttft": [[] for _ in range(seconds)],
    }
    for o in ok:
        second = min(seconds - 1, int(o.started + (o.latency or 0)))
        series["requests"][second] += 1
        series["tokens"][second] += o.output_tokens
        if o.ttft is not None:
            series["ttft"][min(seconds - 1, int(o.started + o.ttft))].append(o.ttft)
    return {
        "duration_s": round(elapsed, 2),
        "requests": len(outcomes),
        "succeeded": len(ok),
        "errors": len(outcomes) - len(ok),
        "errors_by_kind": errors,
        "rate_limited": sum(1 for o in outcomes if o.status == 429),
        "rate_limited_with_retry_after": sum(1 for o in outcomes if o.status == 429 and o.retry_after),
        "server_errors": sum(1 for o in outcomes if o.status >= 500),
        "ttft_ms_p50": _ms(pct(ttfts, 0.5)),
        "ttft_ms_p99": _ms(pct(ttfts, 0.99)),
        "itl_ms_p50": _ms(pct(itls, 0.5)),
        "itl_ms_p99": _ms(pct(itls, 0.99)),
        "latency_ms_p50": _ms(pct(latencies, 0.5)),
        "latency_ms_p99": _ms(pct(latencies, 0.99)),
        "prompt_tokens_mean": round(sum(o.prompt_tokens for o in ok) / len(ok), 1) if ok else None,
        "output_tokens": output,
        "output_tokens_per_s": round(output / elapsed, 2) if elapsed > 0 else None,
        "requests_per_s": round(len(ok) / elapsed, 3) if elapsed > 0 else None,
        "per_second": {
            "requests": series["requests"],
            "output_tokens": series["tokens"],
            "ttft_ms_p50": [_ms(pct(values, 0.5)) for values in series["ttft"]],
        },
    }


FIGURES = (
    "requests",
    "succeeded",
    "errors",
    "rate_limited",
    "server_errors",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "itl_ms_p50",
    "itl_ms_p99",
    "latency_ms_p50",
    "latency_ms_p99",
    "prompt_tokens_mean",
    "output_tokens",
    "output_tokens_per_s",
    "requests_per_s",
    "duration_s",
)


def outcome_dicts(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """The outcomes as plain dicts (for a bench's raw dump)."""
    return [asdict(o) for o in outcomes]

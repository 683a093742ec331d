"""Both ends of `bench/inference_proxy.py`'s streams, each in asyncio processes of their own.

The node's server (`start_node_server`) answers `POST /v1/chat/completions` with server-sent events, as
an OpenAI-compatible server streaming tokens does: one `data:` chunk per token at a fixed interval,
then `data: [DONE]`.

So that the client is never what limits a measurement, the load runs in `LoadGenerators`: one process
per core (uvloop when installed), each opening its share of the concurrent streams, every stream on a
fresh connection. A process takes one JSON line on stdin per load,

    {"port": 8000, "host": "endpoint-x.localhost", "streams": 128, "tokens": 50}

(optionally with "path", "body" (a JSON object), "marker" and "headers": another OpenAI request, such as a
completion from a real server, whose chunks carry `marker`; `STREAM_DEFAULTS`), and answers one JSON line
with what each of its streams saw (time to first token, the gaps between tokens, the time to its end,
tokens counted, the error if any). End of input ends the process. Neither imports Django.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

MARKER = b'"delta"'
DONE = b"data: [DONE]"
CHAT_BODY = {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
# What a stream sends unless its order says otherwise: the chat completion the node stand-in answers.
STREAM_DEFAULTS = {"path": "/v1/chat/completions", "body": CHAT_BODY, "marker": MARKER.decode(), "headers": {}}
BACKLOG = 4096


def serve_tokens(port: int, tokens: int, interval_s: float) -> None:
    """An asyncio SSE server (a process of its own): `tokens` chunks, one every `interval_s`, then a usage
    chunk and `[DONE]`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if length:
                await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                b"Connection: close\r\n\r\n"
            )
            for index in range(tokens):
                event = {
                    "id": "bench",
                    "object": "chat.completion.chunk",
                    "choices": [{"delta": {"content": f"t{index} "}}],
                }
                writer.write(b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n")
                await writer.drain()
                await asyncio.sleep(interval_s)
            # the usage chunk vLLM sends last when asked (stream_options.include_usage): no "delta", not counted
            usage = {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}
            final = {"id": "bench", "object": "chat.completion.chunk", "choices": [], "usage": usage}
            writer.write(b"data: " + json.dumps(final, separators=(",", ":")).encode() + b"\n\n" + DONE + b"\n\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=BACKLOG)
        async with server:
            await server.serve_forever()

    run_loop(main())


def start_node_server(port: int, tokens: int, interval_s: float) -> subprocess.Popen[bytes]:
    """`serve_tokens` in a process (and process group) of its own on 127.0.0.1:`port`."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--serve", str(port), str(tokens), str(interval_s)]
    return subprocess.Popen(argv, start_new_session=True)


@dataclass
class StreamResult:
    """What one client stream saw (times in seconds)."""

    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    total: float | None = None  # from the request's start to the end of the response
    tokens: int = 0
    error: str | None = None


async def one_stream(
    port: int,
    host: str,
    tokens: int,
    *,
    path: str = STREAM_DEFAULTS["path"],
    body: dict | None = None,
    marker: str = STREAM_DEFAULTS["marker"],
    headers: dict[str, str] | None = None,
) -> StreamResult:
    """One streaming completion (a chat completion unless `path` and `body` say otherwise) on a fresh
    connection; times every token (every chunk holding `marker`) as it arrives, and the response's end."""
    result = StreamResult()
    payload = json.dumps(CHAT_BODY if body is None else body).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items()).encode()
    token_marker = marker.encode()
    started = time.perf_counter()
    writer = None
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        request += f"Content-Length: {len(payload)}\r\nConnection: close\r\n"
        writer.write(request.encode() + extra + b"\r\n" + payload)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            rest = await reader.read(300)
            result.error = f"HTTP {status} {rest[:120]!r}"
            return result
        tail = b""
        last = None
        seen_done = False
        while chunk := await reader.read(65536):
            now = time.perf_counter()
            data = tail + chunk
            count = data.count(token_marker)
            for _ in range(count):
                if result.ttft is None:
                    result.ttft = now - started
                elif last is not None:
                    result.gaps.append(now - last)
                last = now
            result.tokens += count
            seen_done = seen_done or DONE in data
            tail = data[-(len(DONE) - 1) :]
        result.total = time.perf_counter() - started
        if result.tokens != tokens or not seen_done:
            result.error = f"incomplete: {result.tokens} of {tokens} tokens"
    except (OSError, asyncio.IncompleteReadError, ValueError) as error:
        result.error = f"{type(error).__name__}: {error}"
    finally:
        if writer is not None:
            writer.close()
    return result


async def serve() -> None:
    """Answer load requests read from stdin until it ends (no thread: stdin is read by the loop)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).strip():
        order = json.loads(line)
        request = {name: order.get(name, default) for name, default in STREAM_DEFAULTS.items()}
        results = await asyncio.gather(
            *(one_stream(order["port"], order["host"], order["tokens"], **request) for _ in range(order["streams"]))
        )
        print(json.dumps([asdict(result) for result in results]), flush=True)


def run_loop(main: object) -> None:
    """Run a coroutine on uvloop when installed (cheaper per event), else asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)  # type: ignore[arg-type]
    else:
        uvloop.run(main)  # type: ignore[arg-type]


class LoadGenerators:
    """`processes` load generator processes, each in a process group of its own, kept for many loads."""

    def __init__(self, processes: int) -> None:
        self.procs = [
            subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            for _ in range(processes)
        ]

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def run(
        self, port: int, host: str, streams: int, tokens: int, **request: object
    ) -> tuple[list[StreamResult], float]:
        """`streams` concurrent streams split over the processes (`request`: any of `STREAM_DEFAULTS` to
        change): every stream's result, and the wall time until the last one ended."""
        shares = [streams // len(self.procs) + (index < streams % len(self.procs)) for index in range(len(self.procs))]
        started = time.perf_counter()
        for proc, share in zip(self.procs, shares, strict=True):
            order = {"port": port, "host": host, "streams": share, "tokens": tokens, **request}
            proc.stdin.write(json.dumps(order) + "\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
        results: list[StreamResult] = []
        for proc in self.procs:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if not line:
                raise RuntimeError(f"load generator {proc.pid} died (exit code {proc.poll()})")
            results += [StreamResult(**entry) for entry in json.loads(line)]
        return results, time.perf_counter() - started

    def stop(self) -> None:
        """End every generator (end of input, then their process groups killed)."""
        for proc in self.procs:
            with contextlib.suppress(OSError, ValueError):
                proc.stdin.close()  # type: ignore[union-attr]
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--serve":
        serve_tokens(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
    else:
        run_loop(serve())

"""A tiny OpenAI-compatible server process standing in for vLLM's (which needs CUDA) in tests.

Run it like vLLM's server: ``python -m tests.support.openai_standin --model <path> --port <port>
--served-model-name <id> [--host H] [--engine-child] [other vLLM flags, ignored]``. Like vLLM it refuses to start when
the model path is not a directory holding ``config.json``. It serves ``GET /v1/models``, ``GET /health``
and ``POST /v1/chat/completions`` (answer: ``echo: <last user message>``; with ``"stream": true`` the
answer comes word by word as Server-Sent Events ending with ``data: [DONE]``).

Like vLLM it reports ``usage`` (prompt tokens: the words of the messages; completion tokens: the words
of the answer): in a JSON answer always, in a stream as a final chunk with no choices when the request
asks for it (``"stream_options": {"include_usage": true}``).

``--start-delay-s S`` (not a vLLM flag) waits S seconds before listening, as loading a model takes time.

``--stream-gate PATH`` (not a vLLM flag) holds a streamed answer's last word until PATH exists (at most
``GATE_WAIT_S``): a client that needs its first event to create PATH proves that every hop in between
passes events on as they are produced, with no wall-clock measure.

Every answer carries ``X-Served-By: <host>:<port>`` (not vLLM's): tests of an endpoint's replicas see which
server answered.

A chat request may carry ``"standin_delay_s": <seconds>`` (not OpenAI's, at most 30): the server holds its
answer that long, a controllable service time for saturation tests. Each chat answer says how many chat
requests the server was serving when it arrived, this one included (``X-Concurrent``), and the most it has
served at once since it started (``X-Peak-Concurrency``): tests see whether a concurrency limit held.

``--max-model-len N`` is honoured as vLLM does: ``GET /v1/models`` lists ``max_model_len`` for the model
(default: ``max_position_embeddings`` of its ``config.json``, else 2048), and a chat request whose prompt
(counted in words) is longer is refused with 400, so tests see which server arguments a server runs with.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

GATE_WAIT_S = 120.0


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="openai_standin")
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--served-model-name", default=None)
    # Like vLLM's engine core: a helper process of the server's, here in a session of its own (the worst
    # case for whoever stops the server), printed as "engine child pid <pid>".
    parser.add_argument("--engine-child", action="store_true")
    parser.add_argument("--stream-gate", type=Path, default=None)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--start-delay-s", type=float, default=0.0)  # (not vLLM's) as a model load takes time
    args, _ignored = parser.parse_known_args(argv)
    return args


def wait_for_gate(gate: Path | None) -> None:
    """Return once `gate` exists (at once without a gate; after GATE_WAIT_S at most, saying so)."""
    deadline = time.monotonic() + GATE_WAIT_S
    while gate is not None and not gate.exists():
        if time.monotonic() > deadline:
            sys.stderr.write(f"openai-standin: {gate} never appeared; sending the last word anyway\n")
            return
        time.sleep(0.05)


DEFAULT_MAX_MODEL_LEN = 2048


def model_max_len(model_dir: Path, given: int | None) -> int:
    """The context length served: `--max-model-len`, else the model config's, else `DEFAULT_MAX_MODEL_LEN`."""
    if given is not None:
        return given
    try:
        configured = json.loads((model_dir / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        configured = None
    return configured if isinstance(configured, int) and configured > 0 else DEFAULT_MAX_MODEL_LEN


def make_handler(
    model_name: str, stream_gate: Path | None = None, max_model_len: int = DEFAULT_MAX_MODEL_LEN
) -> type[BaseHTTPRequestHandler]:
    """The request handler serving `model_name` with a context of `max_model_len` (streamed answers held
    before their last word by `stream_gate`)."""

    serving = {"now": 0, "peak": 0}
    counting = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        concurrent: int | None = None

        def log_message(self, fmt: str, *args: object) -> None:
            sys.stderr.write("openai-standin: " + (fmt % args) + "\n")

        def end_headers(self) -> None:
            host, port = self.server.server_address[:2]
            self.send_header("X-Served-By", f"{host}:{port}")
            if self.concurrent is not None:
                self.send_header("X-Concurrent", str(self.concurrent))
                self.send_header("X-Peak-Concurrency", str(serving["peak"]))
            super().end_headers()

        def _json(self, status: int, body: object) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                card = {"id": model_name, "object": "model", "owned_by": "vllm", "max_model_len": max_model_len}
                self._json(200, {"object": "list", "data": [card]})
            elif self.path == "/health":
                self._json(200, {})
            else:
                self._json(404, {"error": {"message": "not found", "type": "NotFoundError"}})

        def do_POST(self) -> None:
            with counting:
                serving["now"] += 1
                serving["peak"] = max(serving["peak"], serving["now"])
                self.concurrent = serving["now"]
            try:
                self._post()
            finally:
                with counting:
                    serving["now"] -= 1

        def _post(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                request = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                self._json(400, {"error": {"message": "invalid JSON", "type": "BadRequestError"}})
                return
            if self.path != "/v1/chat/completions":
                self._json(404, {"error": {"message": "not found", "type": "NotFoundError"}})
                return
            if request.get("model") != model_name:
                self._json(404, {"error": {"message": f"model {request.get('model')!r} does not exist"}})
                return
            delay = request.get("standin_delay_s")
            if isinstance(delay, (int, float)) and delay > 0:
                time.sleep(min(float(delay), 30.0))
            messages = request.get("messages") or [{}]
            answer = "echo: " + str(messages[-1].get("content", ""))
            completion_id = "chatcmpl-" + uuid.uuid4().hex
            usage = {
                "prompt_tokens": sum(len(str(m.get("content", "")).split()) for m in messages),
                "completion_tokens": len(answer.split()),
            }
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            if usage["prompt_tokens"] > max_model_len:
                message = (
                    f"This model's maximum context length is {max_model_len} tokens. However, your request has "
                    f"{usage['prompt_tokens']} input tokens. Please reduce the length of the input messages."
                )
                self._json(400, {"error": {"message": message, "type": "BadRequestError", "code": 400}})
                return
            if request.get("stream"):
                with_usage = bool((request.get("stream_options") or {}).get("include_usage"))
                self._stream(completion_id, answer, usage if with_usage else None)
                return
            self._json(
                200,
                {
                    "id": completion_id,
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": model_name,
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}
                    ],
                    "usage": usage,
                },
            )

        def _stream(self, completion_id: str, answer: str, usage: dict[str, int] | None) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            words = answer.split(" ")
            for i, word in enumerate(words):
                if i == len(words) - 1 and i > 0:
                    wait_for_gate(stream_gate)
                chunk = {
                    "id": completion_id,
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": model_name,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": word if i == 0 else " " + word},
                            "finish_reason": "stop" if i == len(words) - 1 else None,
                        }
                    ],
                }
                if usage is not None:
                    chunk["usage"] = None  # as vLLM: null on every chunk but the last
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            if usage is not None:
                final = {"id": completion_id, "object": "chat.completion.chunk", "model": model_name, "choices": []}
                self.wfile.write(f"data: {json.dumps(final | {'usage': usage})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    model_dir = Path(args.model)
    if not (model_dir / "config.json").is_file():
        print(f"ValueError: no config.json in model path {model_dir}", file=sys.stderr, flush=True)
        return 1
    name = args.served_model_name or args.model
    if args.engine_child:
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True, stdin=subprocess.DEVNULL
        )
        print(f"engine child pid {child.pid}", flush=True)
    handler = make_handler(name, args.stream_gate, model_max_len(model_dir, args.max_model_len))
    time.sleep(max(0.0, args.start_delay_s))
    server = ThreadingHTTPServer((args.host, args.port), handler)
    server.daemon_threads = True
    print(f"openai-standin serving {name} on {args.host}:{args.port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # pragma: no cover - interactive use
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

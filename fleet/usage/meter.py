"""Usage of proxied endpoint requests, noted in process memory and written in batches.

The proxy starts a `RequestUsage` for each request to an endpoint (`start`), hands it the response's head
(`head`) and body chunks (`feed`) and finishes it when the relay ends (`finish`). Token counts come from
the response itself:

- a JSON answer (`application/json`): its `usage` object (`prompt_tokens`, `completion_tokens`), read
  once at the end from the buffered body (at most JSON_BODY_MAX bytes are kept; past that, the few
  kilobytes from the last `"usage"` key on, so a long answer is charged too);
- a stream of server-sent events: the `usage` of its last events, which OpenAI-compatible servers send
  in a final chunk when asked (`stream_options.include_usage`). The relay asks for it on every streamed
  completions request that does not (`ask_for_usage`) and then drops that chunk on its way to the client
  (`feed` passes events on whole while it does), so the server's own count is charged, prompt included.
  A stream that still has none counts each `data:` event that is not `[DONE]` as one completion token.
  Per chunk the meter only counts `data:` markers and keeps a reference to the last few chunks: nothing
  is parsed until the end (except the events of a stream whose usage the proxy asked for).

A request counts as an error when its answer is a 5xx, never came (status 0), or was cut short (the
stream broke or the client left mid-response).

Finished requests are added up per (minute, workspace, endpoint, API key) in this process, and a request
whose `model` named one of the endpoint's LoRA adapters (`adapter`, set by the relay) per (minute,
workspace, adapter, API key) too: its rows have subject kind `adapter`. The first one
after a flush schedules the next flush USAGE_FLUSH_S later, on a thread (`flush`): one upsert for every
bucket noted (minute and hour rows, `services.usage_add`), so the proxy's path never writes a row per
request and never blocks the event loop on the database. A failed write keeps the counts for the next
flush (tried again USAGE_FLUSH_S later, requests or not), counts itself (`cleverthis_usage_flush_failures`)
and is noted in Redis for the Usage page's banner (`flush_notes`); at process exit whatever is left is
written (`atexit`, and a multiprocessing finalizer for uvicorn's worker processes, which exit without
running `atexit`).

The completion tokens of a request are also counted for the replica that answered it (`replica`, set by
the relay), which the web processes share as tokens per second (`fleet.replica_load`).

Other code may follow finished requests (the API-key rate limiter charges tokens): `on_request_metered`
registers a callback, called on the event loop with (workspace_id, endpoint_id, api_key_id,
prompt_tokens, completion_tokens, rate_caller); it must be quick and must not raise.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import json
import logging
import multiprocessing.util
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import DatabaseError, close_old_connections

from fleet import replica_load
from fleet.usage import flush_notes
from kernel import metrics
from kernel.asgi_scope import api_key_id, rate_caller

log = logging.getLogger(__name__)

JSON_BODY_MAX = 4 * 1024 * 1024  # a JSON answer longer than this keeps only the part around its last "usage"
USAGE_REGION = 4096  # bytes kept from a "usage" key on, in a JSON answer longer than JSON_BODY_MAX
HELD_MAX = 64 * 1024  # a stream's bytes held back waiting for an event's end (to drop an added usage chunk)
REQUEST_REWRITE_MAX = 1024 * 1024  # a completions request longer than this goes as sent (no usage asked)
SSE_TAIL_CHUNKS = 3  # the last chunks kept of a stream (the usage chunk, `[DONE]` and what they were cut from)
_USAGE_KEY = b'"usage"'
_DECODER = json.JSONDecoder()


@dataclass(frozen=True, slots=True)
class Subject:
    """The endpoint a request was made to, and its workspace."""

    workspace_id: UUID
    endpoint_id: UUID


MeteredCallback = Callable[[UUID, UUID, int | None, int, int, int | str | None], None]
_callbacks: list[MeteredCallback] = []

# (minute start, workspace, endpoint, API key) → [requests, errors, prompt, completion, ms sum, ms max,
# rate-limited]
Key = tuple[int, UUID, UUID, int | None]
_pending: dict[Key, list[float]] = {}
_adapter_pending: dict[Key, list[float]] = {}  # the same per LoRA adapter: (minute, workspace, adapter, API key)
_flush_handle: asyncio.TimerHandle | None = None
_flush_loop: asyncio.AbstractEventLoop | None = None

# A failed flush is noted in Redis, one field per process, so the Usage page of any web process can say
# that usage is not being written; a later flush that succeeds clears its process's field.


def on_request_metered(callback: MeteredCallback) -> MeteredCallback:
    """Call `callback(workspace_id, endpoint_id, api_key_id, prompt_tokens, completion_tokens, rate_caller)`
    after each metered request (`rate_caller`: `kernel.asgi_scope.rate_caller` of its scope; usable as a
    decorator; registering one twice keeps one)."""
    if callback not in _callbacks:
        _callbacks.append(callback)
    return callback


def usage_of(body: bytes) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) of the last `"usage": {...}` object in `body`, else None."""
    at = body.rfind(_USAGE_KEY)
    while at >= 0:
        colon = body.find(b":", at + len(_USAGE_KEY))
        if colon < 0:
            return None
        start = colon + 1
        while start < len(body) and body[start] in b" \t\r\n":
            start += 1
        if body[start : start + 1] == b"{":
            try:
                value, _ = _DECODER.raw_decode(body[start:].decode("utf-8", "replace"))
            except ValueError:
                value = None
            if isinstance(value, dict):
                prompt, completion = value.get("prompt_tokens"), value.get("completion_tokens")
                if isinstance(prompt, int) and isinstance(completion, int):
                    return prompt, completion
        at = body.rfind(_USAGE_KEY, 0, at)  # `"usage": null` of a content chunk: look further back
    return None


def ask_for_usage(body: bytes) -> bytes | None:
    """The body of a completions request made to report its usage: a streamed request (`"stream": true`)
    that does not ask for the final usage chunk gets `"stream_options": {"include_usage": true}`, so the
    server counts its tokens (prompt included) instead of the meter guessing them. None when nothing is to
    change (not JSON, not streamed, usage asked for already)."""
    try:
        request = json.loads(body)
    except ValueError:
        return None
    if not isinstance(request, dict) or request.get("stream") is not True:
        return None
    options = request.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict) or options.get("include_usage") is True:
        return None
    request["stream_options"] = {**options, "include_usage": True}
    return json.dumps(request, separators=(",", ":")).encode()


_USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')  # a usage that is not null (content chunks carry null)


def _is_usage_chunk(event: bytes) -> bool:
    """Whether an SSE event is the usage-only chunk a server sends when asked (`"choices": []`, a usage)."""
    text = event.strip()
    if not text.startswith(b"data:") or not _USAGE_OBJECT.search(text):
        return False
    try:
        chunk = json.loads(text[5:])
    except ValueError:
        return False
    return isinstance(chunk, dict) and chunk.get("choices") == [] and isinstance(chunk.get("usage"), dict)


class RequestUsage:
    """What one proxied request used, as its response goes by."""

    __slots__ = (
        "adapter",
        "api_key_id",
        "caller",
        "carry",
        "cut",
        "events",
        "held",
        "kind",
        "parts",
        "region",
        "replica",
        "size",
        "started",
        "status",
        "strip_usage",
        "subject",
    )

    def __init__(self, subject: Subject, key_id: int | None, caller: int | str | None = None) -> None:
        self.subject = subject
        self.api_key_id = key_id
        self.caller = caller  # who the rate limits charge (`kernel.asgi_scope.rate_caller`)
        self.strip_usage = False  # the usage chunk was asked for by the proxy, not the client: drop it
        self.held = b""  # a stream's bytes since its last complete event (while `strip_usage`)
        self.region = b""  # a long JSON answer: from its last "usage" key on (at most USAGE_REGION bytes)
        self.carry = b""  # a long JSON answer: the end of the previous chunk (a key cut across chunks)
        self.started = time.monotonic()
        self.status = 0
        self.kind = ""  # "sse", "json" or "" (usage not read)
        self.parts: collections.deque[bytes] | list[bytes] = []
        self.size = 0
        self.events = 0
        self.cut = False  # the response did not reach the client whole (set by the relay)
        self.replica = ""  # the endpoint replica that answered (set by the relay; its key in `balancer`)
        self.adapter: UUID | None = None  # the LoRA adapter the request named (set by the relay)

    def head(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """The response's head: its status and content type say how to read the body."""
        self.status = status
        for name, value in headers:
            if name.lower() == b"content-type":
                media = bytes(value).split(b";", 1)[0].strip().lower()
                if media == b"text/event-stream":
                    self.kind = "sse"
                    self.parts = collections.deque(maxlen=SSE_TAIL_CHUNKS)
                elif media == b"application/json":
                    self.kind = "json"
                break

    def feed(self, data: bytes) -> bytes:
        """A chunk of the response body on its way to the client; returns what goes on to the client (all of
        it, except the usage chunk of a stream whose usage the proxy asked for: events are then passed on
        whole, a partial one held until its end)."""
        if self.kind == "sse":
            self.events += data.count(b"data:")
            self.parts.append(data)
            if self.strip_usage:
                return self._without_usage_chunk(data)
        elif self.kind == "json":
            self.size += len(data)
            if self.size <= JSON_BODY_MAX:
                self.parts.append(data)
            else:
                self._track_usage_region(data)
        return data

    def held_back(self) -> bytes:
        """What `feed` still holds when the response ends (a last event without its blank line)."""
        held, self.held = self.held, b""
        return held

    def _without_usage_chunk(self, data: bytes) -> bytes:
        buffer = self.held + data
        out: list[bytes] = []
        start = 0
        while (end := buffer.find(b"\n\n", start)) >= 0:
            event = buffer[start : end + 2]
            if not _is_usage_chunk(event):
                out.append(event)
            start = end + 2
        rest = buffer[start:]
        if len(rest) > HELD_MAX:  # no event ends in sight: pass it on rather than hold it all
            out.append(rest)
            rest = b""
        self.held = rest
        return b"".join(out)

    def _track_usage_region(self, data: bytes) -> None:
        window = self.carry + data
        at = window.rfind(_USAGE_KEY)
        if at >= 0:
            self.region = window[at : at + USAGE_REGION]
        elif self.region and len(self.region) < USAGE_REGION:
            self.region += data[: USAGE_REGION - len(self.region)]
        self.carry = window[-len(_USAGE_KEY) :]

    def tokens(self) -> tuple[int, int]:
        """(prompt_tokens, completion_tokens) the response reported, or (0, events) counted from a stream."""
        if self.kind == "json" and self.size > JSON_BODY_MAX:
            found = usage_of(self.region) if self.region else None
            return found if found is not None else self._tokens_of_parts()
        return self._tokens_of_parts()

    def _tokens_of_parts(self) -> tuple[int, int]:
        if not self.kind or not self.parts:
            return 0, 0
        tail = b"".join(self.parts)
        found = usage_of(tail)
        if found is not None:
            return found
        if self.kind == "sse":
            return 0, max(0, self.events - tail.count(b"[DONE]"))
        return 0, 0

    def finish(self, *, complete: bool) -> None:
        """The relay ended (`complete`: the whole response reached the client): note the request."""
        prompt, completion = self.tokens()
        replica_load.count_tokens(self.replica, completion)
        error = not complete or self.status == 0 or self.status >= 500
        observe(
            self.subject,
            self.api_key_id,
            error=error,
            prompt_tokens=prompt,
            completion_tokens=completion,
            seconds=time.monotonic() - self.started,
            caller=self.caller,
            adapter_id=self.adapter,
        )


def start(subject: Subject | None, scope: dict[str, Any]) -> RequestUsage | None:
    """A `RequestUsage` for a request to `subject`, or None when not metered (no subject, metering off)."""
    if subject is None or not settings.USAGE_METERING:
        return None
    return RequestUsage(subject, api_key_id(scope), rate_caller(scope))


def _bucket(subject: Subject, key_id: int | None, now: float | None, adapter_id: UUID | None = None) -> list[float]:
    """The in-memory counts of this minute for `subject` (or its LoRA adapter `adapter_id`) and `key_id` (made
    empty on first use)."""
    minute = int(now if now is not None else time.time()) // 60 * 60
    pending = _pending if adapter_id is None else _adapter_pending
    key = (minute, subject.workspace_id, subject.endpoint_id if adapter_id is None else adapter_id, key_id)
    counts = pending.get(key)
    if counts is None:
        counts = pending[key] = [0, 0, 0, 0, 0.0, 0.0, 0]
    return counts


def observe(
    subject: Subject,
    key_id: int | None,
    *,
    error: bool,
    prompt_tokens: int,
    completion_tokens: int,
    seconds: float,
    now: float | None = None,
    caller: int | str | None = None,
    adapter_id: UUID | None = None,
) -> None:
    """Note one finished request in this process (for its endpoint, and its LoRA adapter `adapter_id` if it
    named one) and schedule the flush if none is."""
    ms = max(seconds, 0.0) * 1000.0
    for counts in [_bucket(subject, key_id, now)] + ([_bucket(subject, key_id, now, adapter_id)] if adapter_id else []):
        counts[0] += 1
        counts[1] += error
        counts[2] += prompt_tokens
        counts[3] += completion_tokens
        counts[4] += ms
        if ms > counts[5]:
            counts[5] = ms
    for callback in _callbacks:
        try:
            callback(subject.workspace_id, subject.endpoint_id, key_id, prompt_tokens, completion_tokens, caller)
        except Exception:
            log.exception("usage callback %r failed", callback)
    _schedule_flush()


def observe_rate_limited(subject: Subject, key_id: int | None, *, now: float | None = None) -> None:
    """Note one request an API key's rate limit refused (429): counted apart from the requests served."""
    if not settings.USAGE_METERING:
        return
    counts = _bucket(subject, key_id, now)
    counts[6] += 1
    _schedule_flush()


def _schedule_flush() -> None:
    global _flush_handle, _flush_loop
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # a sync caller (no loop): write now
        flush()
        return
    if _flush_handle is not None and _flush_loop is loop:
        return  # one is due on this loop
    _flush_loop = loop
    _flush_handle = loop.call_later(settings.USAGE_FLUSH_S, _flush_in_thread, loop)


def _flush_in_thread(loop: asyncio.AbstractEventLoop) -> None:
    global _flush_handle
    _flush_handle = None
    loop.run_in_executor(None, _flush_and_release, loop)


def _flush_and_release(loop: asyncio.AbstractEventLoop | None = None) -> None:
    try:
        flush()
    except Exception:  # (on a thread nobody waits for: say so rather than lose it silently)
        log.exception("usage flush failed")
    finally:
        close_old_connections()  # this thread's connection, as channels' database_sync_to_async does
    if flush_notes.failing() and (_pending or _adapter_pending) and loop is not None and not loop.is_closed():
        # the counts went back to memory: try again in USAGE_FLUSH_S, whether or not requests come
        loop.call_soon_threadsafe(_schedule_flush)


def flush() -> int:
    """Write every noted bucket with one upsert (minute and hour rows); returns how many buckets it wrote.

    When the database refuses, the counts go back to memory for the next flush (nothing is lost).
    """
    from fleet.usage import services  # (loaded at first use: the proxy imports this module early)

    taken = _take(_pending)
    adapters_taken = _take(_adapter_pending)
    if not taken and not adapters_taken:
        return 0
    rows = _rows(taken, "endpoint") + _rows(adapters_taken, "adapter")
    try:
        services.usage_add(rows=rows)
    except DatabaseError as exc:
        log.exception("usage flush failed; %d buckets kept for the next one", len(taken) + len(adapters_taken))
        for key, counts in taken:
            _merge(key, counts)
        for key, counts in adapters_taken:
            _merge(key, counts, _adapter_pending)
        metrics.USAGE_FLUSH_FAILURES.inc()
        flush_notes.note_failure(exc, len(taken) + len(adapters_taken))
        return 0
    if flush_notes.failing():
        flush_notes.note_recovered()
    for (_, workspace_id, endpoint_id, _), (requests, errors, prompt, completion, *_) in taken:
        metrics.count_endpoint_usage(str(workspace_id), str(endpoint_id), requests, errors, prompt, completion)
    return len(taken) + len(adapters_taken)


def _take(pending: dict[Key, list[float]]) -> list[tuple[Key, list[float]]]:
    taken = list(pending.items())
    for key, _ in taken:
        pending.pop(key, None)
    return taken


def _rows(taken: list[tuple[Key, list[float]]], subject_kind: str) -> list[Any]:
    """The minute and hour rollups of the buckets `taken` (their subject: an endpoint or an adapter)."""
    from fleet.usage import services

    rows: list[services.Rollup] = []
    for (minute, workspace_id, subject_id, key_id), counts in taken:
        requests, errors, prompt, completion, ms_sum, ms_max, limited = counts
        counters = {
            "requests": int(requests),
            "errors": int(errors),
            "rate_limited": int(limited),
            "prompt_tokens": int(prompt),
            "completion_tokens": int(completion),
            "latency_ms_sum": round(ms_sum, 3),
            "latency_ms_max": round(ms_max, 3),
        }
        for granularity, start in (("minute", minute), ("hour", minute // 3600 * 3600)):
            rows.append(
                services.Rollup(
                    granularity=granularity,
                    bucket_start=datetime.fromtimestamp(start, UTC),
                    workspace_id=workspace_id,
                    subject_kind=subject_kind,
                    subject_id=subject_id,
                    api_key_id=key_id,
                    **counters,
                )
            )
    return rows


def discard() -> None:
    """Forget what was noted and not written (tests: nothing of one leaks into the next)."""
    global _flush_handle
    _pending.clear()
    _adapter_pending.clear()
    if flush_notes.failing():
        flush_notes.note_recovered()
    if _flush_handle is not None:
        _flush_handle.cancel()
        _flush_handle = None


def _merge(key: Key, counts: list[float], pending: dict[Key, list[float]] | None = None) -> None:
    pending = _pending if pending is None else pending
    mine = pending.get(key)
    if mine is None:
        pending[key] = counts
        return
    for i in (0, 1, 2, 3, 4, 6):
        mine[i] += counts[i]
    mine[5] = max(mine[5], counts[5])
    mine[5] = max(mine[5], counts[5])


def _flush_at_exit() -> None:
    if not _pending and not _adapter_pending:
        return
    try:
        flush()
    except Exception:  # the process is ending: say so, never raise
        log.exception("usage flush at exit failed")


atexit.register(_flush_at_exit)
# uvicorn's workers are multiprocessing children, which leave with os._exit (no atexit): its finalizers run
multiprocessing.util.Finalize(None, _flush_at_exit, exitpriority=10)

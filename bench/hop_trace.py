"""Timestamps of every hop a proxied stream takes, written by the web and agent processes of a benchmark.

Loaded into a process by `bench/hop_trace_site/sitecustomize.py` (that folder on PYTHONPATH) when
`HOP_TRACE_DIR` is set; nothing in the project imports it. It wraps, once each module is imported, the
functions a proxied stream passes through and appends one line per event to `<HOP_TRACE_DIR>/<pid>.trace`:
`<CLOCK_MONOTONIC seconds> <event> <key> <value>` (the clock is the machine's, so the processes' lines
compare). Events, in a stream's order:

- web (`cleverthis.asgi`, `fleet.proxy.streams`, `fleet.tunnel.outbox`): `req` (the ASGI app called: request
  id), `opened` (the tunnel stream opened: request id → stream id), `put` (a frame queued for the agent:
  stream id, frame type), `wsout` (a message put on the tunnel's socket: bytes), `deliver` (a frame from the
  agent handed to its stream: stream id, bytes), `start` / `body` (the response's head and each body message
  sent to the client: request id, bytes);
- agent (`agent.transport.proxy`, `agent.transport.sender`): `a.frame` (a stream frame from the control
  plane: stream id, type), `a.conn` (connected to the server), `a.up` (response bytes from the server: stream
  id, bytes), `a.wsout` (a message put on the socket: bytes).

`analyse(folder, start, end)` turns one window of them into per-hop figures (`bench/proxy_extra.py --trace`).
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib.abc
import importlib.machinery
import itertools
import os
import statistics
import sys
import threading
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any

_request: contextvars.ContextVar[int] = contextvars.ContextVar("hop_trace_request", default=0)
_ids = itertools.count(1)
_out = None


def event(name: str, key: object = "-", value: object = "-") -> None:
    global _out
    if _out is None:
        folder = Path(os.environ["HOP_TRACE_DIR"])
        folder.mkdir(parents=True, exist_ok=True)
        _out = open(folder / f"{os.getpid()}.trace", "a", buffering=1)
    _out.write(f"{time.monotonic():.6f} {name} {key} {value}\n")


# -- event-loop stalls --------------------------------------------------------------------------------

STALL_S = 0.02  # a loop that has not run a callback for this long is stalled: its thread's stack is noted
_TICK_S = 0.002


def watch_loop() -> None:
    """Note every stall of the running loop: a `stall` event with where its thread was (its innermost frames,
    and every other busy thread's), and a `stalled` event with its length once the loop runs again."""
    loop = asyncio.get_running_loop()
    if getattr(loop, "_hop_trace_watched", False):
        return
    loop._hop_trace_watched = True  # type: ignore[attr-defined]
    beat = [time.monotonic()]
    loop_thread = threading.get_ident()

    def tick() -> None:
        beat[0] = time.monotonic()
        loop.call_later(_TICK_S, tick)

    def watch() -> None:
        noted = 0.0
        while True:
            time.sleep(_TICK_S)
            late = time.monotonic() - beat[0]
            if late >= STALL_S and noted != beat[0]:
                noted = beat[0]
                frames = sys._current_frames()
                where = " | ".join(_frames(frames.get(loop_thread)))
                others = [
                    _frames(f)[-1] for ident, f in frames.items() if ident not in (loop_thread, threading.get_ident())
                ]
                event("stall", f"{noted:.6f}", f"loop: {where} || others: {'; '.join(others)}")
            elif late < STALL_S and noted and noted != -1:
                event("stalled", f"{noted:.6f}", f"{(beat[0] - noted) * 1000:.1f}")
                noted = -1

    loop.call_soon(tick)
    threading.Thread(target=watch, name="hop-trace-watch", daemon=True).start()


def _frames(frame: Any, depth: int = 6) -> list[str]:
    if frame is None:
        return ["?"]
    stack = traceback.extract_stack(frame)[-depth:]
    return [f"{Path(f.filename).name}:{f.lineno}:{f.name}" for f in stack]


# -- the wrappers, by module ------------------------------------------------------------------------


def _asgi(module: Any) -> None:
    inner = module.application

    async def application(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await inner(scope, receive, send)
        watch_loop()
        rid = next(_ids)
        _request.set(rid)
        event("req", rid, scope.get("path", ""))

        async def traced_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                event("start", rid, message.get("status"))
            elif message["type"] == "http.response.body":
                event("body", rid, len(message.get("body", b"")))
            await send(message)

        return await inner(scope, receive, traced_send)

    module.application = application


def _streams(module: Any) -> None:
    cls = module.TunnelStream
    opener = cls.open.__func__

    async def open_(klass: Any, **kwargs: Any) -> Any:
        stream = await opener(klass, **kwargs)
        event("opened", _request.get(), stream.stream_id)
        return stream

    cls.open = classmethod(open_)
    deliver = cls.deliver

    def traced_deliver(self: Any, message: dict) -> None:
        event("deliver", self.stream_id, len(message.get("data", b"")) if message.get("type") == "stream.data" else 0)
        deliver(self, message)

    cls.deliver = traced_deliver


def _outbox(module: Any) -> None:
    cls = module.StreamOutbox
    put, init = cls.put, cls.__init__

    def traced_put(self: Any, frame: Any) -> None:
        event("put", frame.stream_id, type(frame).__name__)
        put(self, frame)

    def traced_init(self: Any, send: Any, version: int) -> None:
        async def traced_send(message: Any) -> None:
            event("wsout", "-", len(message))
            await send(message)

        init(self, traced_send, version)

    cls.put, cls.__init__ = traced_put, traced_init


def _agent_proxy(module: Any) -> None:
    manager, upstream = module.StreamManager, module._Upstream
    handle, connected, updated = manager.handle, upstream.connection_made, upstream.buffer_updated

    def traced_handle(self: Any, frame: Any) -> None:
        event("a.frame", getattr(frame, "stream_id", "-"), type(frame).__name__)
        handle(self, frame)

    def traced_connected(self: Any, transport: Any) -> None:
        event("a.conn", self.stream.stream_id)
        connected(self, transport)

    def traced_updated(self: Any, nbytes: int) -> None:
        event("a.up", self.stream.stream_id, nbytes)
        updated(self, nbytes)

    manager.handle, upstream.connection_made, upstream.buffer_updated = traced_handle, traced_connected, traced_updated


def _agent_sender(module: Any) -> None:
    cls = module.FrameSender
    init = cls.__init__

    class TracedSocket:
        def __init__(self, ws: Any) -> None:
            self._ws = ws

        async def send(self, message: Any) -> None:
            event("a.wsout", "-", len(message))
            await self._ws.send(message)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._ws, name)

    def traced_init(self: Any, ws: Any, *args: Any, **kwargs: Any) -> None:
        init(self, TracedSocket(ws), *args, **kwargs)
        watch_loop()

    cls.__init__ = traced_init


HOOKS = {
    "cleverthis.asgi": _asgi,
    "fleet.proxy.streams": _streams,
    "fleet.tunnel.outbox": _outbox,
    "agent.transport.proxy": _agent_proxy,
    "agent.transport.sender": _agent_sender,
}


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps a hooked module's functions right after it is executed."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in HOOKS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        loader, hook = spec.loader, HOOKS[name]
        execute = loader.exec_module

        def exec_module(module: Any) -> None:
            execute(module)
            hook(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


GC_NOTED_S = 0.005  # a garbage collection at least this long is noted (`gc` event: generation, ms)


def _gc_callback(phase: str, info: dict) -> None:
    global _gc_started
    if phase == "start":
        _gc_started = time.monotonic()
        return
    spent = time.monotonic() - _gc_started
    if spent >= GC_NOTED_S:
        event("gc", info.get("generation"), f"{spent * 1000:.1f}")


_gc_started = 0.0


def install() -> None:
    """Trace this process (called by the sitecustomize when HOP_TRACE_DIR is set)."""
    import gc

    sys.meta_path.insert(0, _Finder())
    gc.callbacks.append(_gc_callback)


# -- reading them back ------------------------------------------------------------------------------


def read(folder: Path, start: float, end: float) -> list[tuple[float, str, str, str, str]]:
    """Every event of every process between `start` and `end` (monotonic seconds), in time order: (time,
    event, key, value, the process's pid)."""
    events = []
    for path in folder.glob("*.trace"):
        for line in path.read_text().splitlines():
            parts = line.split(" ", 3)
            if len(parts) == 4 and start <= float(parts[0]) <= end:
                events.append((float(parts[0]), parts[1], parts[2], parts[3], path.stem))
    return sorted(events)


def stalls(folder: Path, start: float, end: float) -> list[tuple[str, float, str]]:
    """The event-loop stalls that ended between `start` and `end`: (pid, ms, where its loop's thread was)."""
    where: dict[tuple[str, str], str] = {}
    found = []
    for _t, name, key, value, pid in read(folder, start - 5, end + 1):
        if name == "stall":
            where[(pid, key)] = value
        elif name == "stalled" and start <= float(key) <= end:
            found.append((pid, float(value), where.get((pid, key), "?")))
    return found


def _after(times: list[float], t: float) -> float | None:
    """The first of (sorted) `times` at or after `t`."""
    return next((x for x in times if x >= t), None)


def analyse(folder: Path, start: float, end: float) -> dict[str, list[float]]:
    """Per hop, the milliseconds each stream (or each chunk) spent in it during [start, end]."""
    events = read(folder, start, end)
    first: dict[tuple[str, str], float] = {}
    chunks: dict[tuple[str, str], list[float]] = defaultdict(list)
    wsout, a_wsout = [], []
    sid_of: dict[str, str] = {}
    for t, name, key, value, _pid in events:
        if name == "opened":
            sid_of[key] = value
        elif name == "wsout":
            wsout.append(t)
        elif name == "a.wsout":
            a_wsout.append(t)
        elif name == "put" and value != "StreamOpen":
            continue
        elif name in ("body", "deliver") and value == "0":
            continue  # (an empty last body message; credit or an end, not response bytes)
        if name in ("a.up", "deliver", "body"):
            chunks[(name, key)].append(t)
        first.setdefault((name, key), t)
    hops: dict[str, list[float]] = defaultdict(list)
    for rid, sid in sid_of.items():
        try:
            times = {
                "req": first[("req", rid)],
                "opened": first[("opened", rid)],
                "put": first[("put", sid)],
                "a.frame": first[("a.frame", sid)],
                "a.conn": first[("a.conn", sid)],
                "a.up": first[("a.up", sid)],
                "deliver": first[("deliver", sid)],
                "start": first[("start", rid)],
            }
        except KeyError:
            continue
        sent = _after(wsout, times["put"])
        out = _after(a_wsout, times["a.up"])
        steps = [
            ("web: request in → stream opened (auth, route, admission)", times["req"], times["put"]),
            ("web: open queued → on the tunnel socket", times["put"], sent),
            ("tunnel → agent: socket → open frame handled", sent, times["a.frame"]),
            ("agent: open → connected to the server", times["a.frame"], times["a.conn"]),
            ("server: connected → first response bytes (its head)", times["a.conn"], times["a.up"]),
            ("agent: first bytes in → on the tunnel socket", times["a.up"], out),
            ("tunnel → web: socket → delivered to the stream", out, times["deliver"]),
            ("web: delivered → response head to the client", times["deliver"], times["start"]),
            ("request in → response head (all hops)", times["req"], times["start"]),
        ]
        for label, a, b in steps:
            if a is not None and b is not None:
                hops[label].append((b - a) * 1000)
        ups, bodies = chunks.get(("a.up", sid), []), chunks.get(("body", rid), [])
        for up, body in zip(reversed(ups), reversed(bodies), strict=False):  # (the last ones match)
            hops["each chunk: agent got it → web sent it to the client"].append((body - up) * 1000)
        if ups and bodies:
            hops["last chunk: agent got it → web sent it to the client"].append((bodies[-1] - ups[-1]) * 1000)
            hops["server: first → last response bytes (the stream at the agent)"].append((ups[-1] - ups[0]) * 1000)
    return dict(hops)


def summary(hops: dict[str, list[float]]) -> list[str]:
    """One line per hop: median, 90th percentile and max in ms, and how many samples."""
    lines = []
    for label, values in hops.items():
        ordered = sorted(values)
        p90 = ordered[int(0.9 * (len(ordered) - 1))]
        lines.append(
            f"  {label:<66} p50 {statistics.median(ordered):7.1f}  p90 {p90:7.1f}  max {ordered[-1]:7.1f}"
            f"  (n={len(ordered)})"
        )
    return lines

"""Agent side of proxied streams against a real local TCP server: piping, credit and errors."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agent import protocol as p
from agent.transport.proxy import StreamManager
from tests.support.processes import free_port

pytestmark = pytest.mark.asyncio


class Peer:
    """Plays the control plane: collects frames the agent sends, in order."""

    def __init__(self) -> None:
        self.frames: list[p.Frame] = []
        self.arrived = asyncio.Event()

        self.received: dict[int, bytearray] = {}

    def send(self, frame: p.Frame) -> None:
        frame = p.decode(p.encode(frame))  # through the real codec
        if isinstance(frame, p.StreamData):
            self.received.setdefault(frame.stream_id, bytearray()).extend(frame.payload())
        else:
            self.frames.append(frame)
        self.arrived.set()

    def data(self, stream_id: int) -> bytes:
        return bytes(self.received.get(stream_id, b""))

    def ended(self, stream_id: int) -> p.StreamEnd | None:
        return next((f for f in self.frames if isinstance(f, p.StreamEnd) and f.stream_id == stream_id), None)

    async def wait_for(self, predicate, timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self.arrived.clear()
                await self.arrived.wait()


async def http_server(body: bytes) -> tuple[asyncio.Server, int, list[bytes]]:
    requests: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        await writer.drain()
        writer.close()

    port = free_port()
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    return server, port, requests


async def test_stream_pipes_a_request_and_response():
    server, port, requests = await http_server(b"hello through the tunnel")
    peer = Peer()
    manager = StreamManager(peer.send)
    manager.handle(p.StreamOpen(stream_id=1, port=port))
    manager.handle(p.StreamData.of(1, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"))
    await peer.wait_for(lambda: peer.ended(1) is not None)
    assert peer.data(1).endswith(b"\r\n\r\nhello through the tunnel")
    assert requests[0].startswith(b"GET /v1/models HTTP/1.1")
    assert peer.ended(1).error == ""
    # request bytes written locally are credited back to the control plane
    assert any(isinstance(f, p.StreamWindow) and f.stream_id == 1 for f in peer.frames)
    assert manager.open_streams == 0
    server.close()


async def test_agent_never_sends_more_than_the_granted_window():
    body = b"x" * (1024 * 1024)
    server, port, _ = await http_server(body)
    peer = Peer()
    manager = StreamManager(peer.send)
    window = 100_000
    manager.handle(p.StreamOpen(stream_id=7, port=port, window=window))
    manager.handle(p.StreamData.of(7, b"GET / HTTP/1.1\r\n\r\n"))
    await peer.wait_for(lambda: len(peer.data(7)) >= window)
    await asyncio.sleep(0.2)  # would the agent send more without credit?
    assert len(peer.data(7)) == window
    granted = window
    while peer.ended(7) is None:
        manager.handle(p.StreamWindow(stream_id=7, increment=window))
        granted += window
        limit = granted
        await peer.wait_for(lambda limit=limit: len(peer.data(7)) >= limit or peer.ended(7) is not None)
        assert len(peer.data(7)) <= granted
    assert peer.data(7).endswith(body)
    server.close()


async def test_streams_are_independent():
    server_a, port_a, _ = await http_server(b"A" * 5000)
    server_b, port_b, _ = await http_server(b"B" * 5000)
    peer = Peer()
    manager = StreamManager(peer.send)
    manager.handle(p.StreamOpen(stream_id=1, port=port_a, window=10))  # starved stream
    manager.handle(p.StreamOpen(stream_id=2, port=port_b))
    for sid in (1, 2):
        manager.handle(p.StreamData.of(sid, b"GET / HTTP/1.1\r\n\r\n"))
    await peer.wait_for(lambda: peer.ended(2) is not None)
    assert peer.data(2).endswith(b"B" * 5000)
    assert len(peer.data(1)) == 10
    assert peer.ended(1) is None
    manager.close_all()
    server_a.close()
    server_b.close()


async def test_more_than_a_thousand_streams_stay_open_at_once():
    """Streaming inference holds one stream per client for the whole answer: 1,100 at once are served."""
    release = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\ndata: first\n\n")
        await writer.drain()
        await release.wait()
        writer.close()

    port = free_port()
    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=2048)
    peer = Peer()
    manager = StreamManager(peer.send)
    ids = range(1, 1101)
    for sid in ids:
        manager.handle(p.StreamOpen(stream_id=sid, port=port))
        manager.handle(p.StreamData.of(sid, b"POST /v1/chat/completions HTTP/1.1\r\n\r\n"))
    await peer.wait_for(lambda: all(peer.data(sid).endswith(b"data: first\n\n") for sid in ids), timeout=60)
    assert manager.open_streams == len(ids)
    assert [f for f in peer.frames if isinstance(f, p.StreamEnd)] == []
    release.set()
    await peer.wait_for(lambda: all(peer.ended(sid) is not None for sid in ids), timeout=60)
    assert manager.open_streams == 0
    server.close()


async def test_streams_over_the_cap_are_refused_with_a_reason(monkeypatch):
    import agent.transport.proxy as proxy

    monkeypatch.setattr(proxy, "MAX_STREAMS", 2)
    server, port, _ = await http_server(b"x")
    peer = Peer()
    manager = StreamManager(peer.send)
    for sid in (1, 2, 3):
        manager.handle(p.StreamOpen(stream_id=sid, port=port, window=1))
    assert peer.ended(3).error == "too many open streams on this node"
    assert peer.ended(1) is None
    assert peer.ended(2) is None
    manager.close_all()
    server.close()


async def test_connection_refused_ends_the_stream_with_an_error():
    peer = Peer()
    manager = StreamManager(peer.send)
    manager.handle(p.StreamOpen(stream_id=3, port=free_port()))
    await peer.wait_for(lambda: peer.ended(3) is not None)
    assert "cannot connect" in peer.ended(3).error


async def test_disallowed_port_is_refused():
    peer = Peer()
    manager = StreamManager(peer.send, allowed_port=lambda port: port == 8265)
    manager.handle(p.StreamOpen(stream_id=4, port=22))
    assert "not proxied" in peer.ended(4).error


async def test_a_stream_pump_that_fails_unexpectedly_aborts_its_stream_and_is_logged_once(caplog):
    """Injected: sending the credit for written request bytes raises inside the request pump.

    The stream is aborted with an error both ends see (never left half open), the failure is logged
    once with its traceback, and another stream on the same tunnel carries on.
    """
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        held.append(writer)  # answers nothing, keeps the connection open

    port = free_port()
    server = await asyncio.start_server(silent, "127.0.0.1", port)
    other_server, other_port, _ = await http_server(b"still fine")
    peer = Peer()

    def send(frame: p.Frame) -> None:
        if isinstance(frame, p.StreamWindow) and frame.stream_id == 5:
            raise RuntimeError("injected failure in the pump")
        peer.send(frame)

    manager = StreamManager(send)
    with caplog.at_level(logging.ERROR, logger="agent.proxy"):
        manager.handle(p.StreamOpen(stream_id=5, port=port))
        manager.handle(p.StreamData.of(5, b"GET / HTTP/1.1\r\n\r\n"))
        await peer.wait_for(lambda: peer.ended(5) is not None)
    assert "RuntimeError" in peer.ended(5).error
    assert manager.open_streams == 0
    logged = [r for r in caplog.records if r.exc_info]
    assert len(logged) == 1
    assert str(logged[0].exc_info[1]) == "injected failure in the pump"

    manager.handle(p.StreamOpen(stream_id=6, port=other_port))
    manager.handle(p.StreamData.of(6, b"GET / HTTP/1.1\r\n\r\n"))
    await peer.wait_for(lambda: peer.ended(6) is not None)
    assert peer.data(6).endswith(b"still fine")
    for writer in held:
        writer.close()
    server.close()
    other_server.close()


async def test_a_stream_with_a_host_dials_that_host_when_it_is_a_managed_head():
    """KubeRay heads: the agent dials the in-cluster host the frame names (here 127.0.0.2, not 127.0.0.1)."""
    requests: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nhead")
        await writer.drain()
        writer.close()

    port = free_port()
    server = await asyncio.start_server(handle, "127.0.0.2", port)
    peer = Peer()
    manager = StreamManager(
        peer.send, allowed_port=lambda _: False, allowed_target=lambda host, p_: (host, p_) == ("127.0.0.2", port)
    )
    manager.handle(p.StreamOpen(stream_id=8, port=port, host="127.0.0.2"))
    manager.handle(p.StreamData.of(8, b"GET /api/version HTTP/1.1\r\nHost: x\r\n\r\n"))
    await peer.wait_for(lambda: peer.ended(8) is not None)
    assert peer.ended(8).error == ""
    assert peer.data(8).endswith(b"\r\n\r\nhead")
    assert requests[0].startswith(b"GET /api/version")
    server.close()


async def test_a_host_the_agent_does_not_manage_is_refused_even_on_an_allowed_port():
    peer = Peer()
    manager = StreamManager(peer.send, allowed_port=lambda port: port == 8265)
    manager.handle(p.StreamOpen(stream_id=9, port=8265, host="kubernetes.default.svc"))
    assert "kubernetes.default.svc:8265 is not proxied" in peer.ended(9).error

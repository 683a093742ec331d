"""The agent's FrameSender: control frames first, but a stream's normal end stays behind its data."""

from __future__ import annotations

from agent import protocol as p


def test_a_streams_normal_end_never_overtakes_its_queued_data_but_control_frames_and_aborts_do():
    import asyncio

    from agent.transport.tunnel import FrameSender

    class Socket:
        def __init__(self) -> None:
            self.sent: list[p.Frame] = []

        async def send(self, raw: str | bytes) -> None:
            self.sent.append(p.decode(raw))

    async def scenario() -> list[p.Frame]:
        socket = Socket()
        sender = FrameSender(socket)
        for i in range(3):
            sender.send(p.StreamData.of(7, bytes([i]) * 10))
        sender.send(p.StreamEnd(stream_id=7))
        sender.send(p.Heartbeat(cpu_percent=1.0, memory_percent=1.0))
        sender.send(p.StreamEnd(stream_id=9, error="aborted"))
        writer = asyncio.ensure_future(sender.run())
        while len(socket.sent) < 6:
            await asyncio.sleep(0.01)
        writer.cancel()
        return socket.sent

    sent = asyncio.run(scenario())
    assert [type(f).__name__ for f in sent[:2]] == ["Heartbeat", "StreamEnd"]
    assert sent[1].stream_id == 9
    assert [type(f).__name__ for f in sent[2:]] == ["StreamData", "StreamData", "StreamData", "StreamEnd"]
    assert [f.payload()[0] for f in sent[2:5]] == [0, 1, 2]

"""`TunnelStream.read` timeouts: one timer per stream, yet each read waits only as long as it was told."""

from __future__ import annotations

import asyncio

import pytest

from fleet.proxy.streams import TunnelStream


def _data(payload: bytes) -> dict[str, object]:
    return {"type": "stream.data", "data": payload}


async def _deliver_later(stream: TunnelStream, payload: bytes, delay: float) -> None:
    await asyncio.sleep(delay)
    stream.deliver(_data(payload))


@pytest.mark.asyncio
async def test_a_read_times_out_when_nothing_arrives():
    stream = TunnelStream(1, 1024)
    with pytest.raises(TimeoutError):
        await stream.read(timeout=0.01)


@pytest.mark.asyncio
async def test_a_shorter_timeout_after_a_longer_one_still_fires_on_time():
    stream = TunnelStream(1, 1024)
    arriving = asyncio.ensure_future(_deliver_later(stream, b"a", 0.01))
    assert await stream.read(timeout=60) == b"a"  # arms the stream's timer an hour away
    await arriving
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(stream.read(timeout=0.01), timeout=5)  # not the hour left on that timer


@pytest.mark.asyncio
async def test_a_timer_armed_by_an_earlier_read_does_not_cut_a_later_longer_one_short():
    stream = TunnelStream(1, 1024)
    arriving = asyncio.ensure_future(_deliver_later(stream, b"a", 0.001))
    assert await stream.read(timeout=0.05) == b"a"  # its timer stays armed for ~50 ms
    await arriving
    later = asyncio.ensure_future(_deliver_later(stream, b"b", 0.1))  # after that timer fired
    assert await stream.read(timeout=5) == b"b"
    await later


@pytest.mark.asyncio
async def test_a_read_without_timeout_waits_past_an_old_timer():
    stream = TunnelStream(1, 1024)
    arriving = asyncio.ensure_future(_deliver_later(stream, b"a", 0.001))
    assert await stream.read(timeout=0.02) == b"a"
    await arriving
    later = asyncio.ensure_future(_deliver_later(stream, b"b", 0.06))
    assert await stream.read(timeout=None) == b"b"
    await later
    await stream.close()

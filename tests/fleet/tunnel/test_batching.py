"""`Coalescer`: frames from many tunnels that arrive together are written in one call."""

from __future__ import annotations

import asyncio

import pytest

from fleet.tunnel.batching import Coalescer


def test_items_arriving_while_a_write_runs_go_together_in_the_next_batch():
    batches: list[list[int]] = []
    gate = asyncio.Event()

    async def write(items: list[int]) -> list[int | Exception]:
        batches.append(list(items))
        if len(batches) == 1:
            await gate.wait()  # the first write is slow: everything after it piles up
        return [ValueError(f"bad {i}") if i < 0 else i * 10 for i in items]

    async def scenario() -> list[object]:
        coalescer: Coalescer[int, int] = Coalescer(write)
        first = asyncio.ensure_future(coalescer.submit(1))
        await asyncio.sleep(0)
        later = [asyncio.ensure_future(coalescer.submit(i)) for i in (2, -3, 4)]
        await asyncio.sleep(0.01)
        gate.set()
        return await asyncio.gather(first, *later, return_exceptions=True)

    results = asyncio.run(scenario())
    assert batches == [[1], [2, -3, 4]]
    assert results[0] == 10
    assert results[1] == 20
    assert results[3] == 40
    assert isinstance(results[2], ValueError)
    assert str(results[2]) == "bad -3"


def test_a_failing_write_fails_only_its_own_batch_and_the_next_one_still_runs():
    calls = 0

    async def write(items: list[str]) -> list[str | Exception]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("database went away")
        return [item.upper() for item in items]

    async def scenario() -> tuple[object, str]:
        coalescer: Coalescer[str, str] = Coalescer(write)
        try:
            await coalescer.submit("a")
        except ConnectionError as exc:
            failed: object = exc
        return failed, await coalescer.submit("b")

    failed, ok = asyncio.run(scenario())
    assert isinstance(failed, ConnectionError)
    assert ok == "B"


def test_batches_are_capped_and_a_new_event_loop_starts_clean():
    batches: list[int] = []

    async def write(items: list[int]) -> list[int | Exception]:
        batches.append(len(items))
        await asyncio.sleep(0)
        return list(items)

    coalescer: Coalescer[int, int] = Coalescer(write, max_batch=3)

    async def scenario() -> list[int]:
        return await asyncio.gather(*(coalescer.submit(i) for i in range(7)))

    assert asyncio.run(scenario()) == list(range(7))
    assert max(batches) == 3
    assert sum(batches) == 7
    assert asyncio.run(scenario()) == list(range(7))  # another loop: no stale writer task from the first


def test_cancelling_the_writer_cancels_its_waiters_instead_of_hanging_them():
    async def write(items: list[int]) -> list[int | Exception]:
        await asyncio.sleep(10)
        return list(items)

    async def scenario() -> None:
        coalescer: Coalescer[int, int] = Coalescer(write)
        waiter = asyncio.ensure_future(coalescer.submit(1))
        await asyncio.sleep(0.01)
        coalescer._writer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiter, timeout=1)

    asyncio.run(scenario())


def test_a_batch_that_fails_as_a_whole_is_retried_one_by_one_so_only_the_bad_item_fails():
    seen: list[list[str]] = []
    gate = asyncio.Event()

    async def write(items: list[str]) -> list[str | Exception]:
        seen.append(list(items))
        if items == ["first"]:
            await gate.wait()
        if "bad" in items:  # like one value PostgreSQL refuses failing the whole statement
            raise ValueError("refused")
        return [item.upper() for item in items]

    async def scenario() -> list[object]:
        coalescer: Coalescer[str, str] = Coalescer(write)
        first = asyncio.ensure_future(coalescer.submit("first"))
        await asyncio.sleep(0)
        rest = [asyncio.ensure_future(coalescer.submit(i)) for i in ("ok", "bad", "fine")]
        await asyncio.sleep(0.01)
        gate.set()
        return await asyncio.gather(first, *rest, return_exceptions=True)

    first, ok, bad, fine = asyncio.run(scenario())
    assert (first, ok, fine) == ("FIRST", "OK", "FINE")
    assert isinstance(bad, ValueError)
    assert seen == [["first"], ["ok", "bad", "fine"], ["ok"], ["bad"], ["fine"]]


def test_inbox_reader_stops_when_cancelled_even_if_redis_turns_the_cancel_into_an_error():
    """channels_redis may answer a cancelled BZPOPMIN with ConnectionError; the reader must still end."""
    from fleet.tunnel import local_tunnels

    class Layer:
        async def receive(self, name: str) -> dict:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                raise ConnectionError("Connection closed by server.") from None
            return {}

    async def scenario() -> bool:
        reader = asyncio.ensure_future(local_tunnels._read_inbox(Layer(), "inbox"))
        await asyncio.sleep(0.01)
        reader.cancel()
        done, _ = await asyncio.wait({reader}, timeout=3)
        return reader in done and reader.cancelled()

    assert asyncio.run(scenario())

"""Coalesce the same database write from many tunnels into one call (one thread hop, one transaction).

When a command goes to All nodes, every tunnel in this process acknowledges it within milliseconds.
Recording each ack on its own costs a thread-pool hop, a transaction and its commit per ack; with
`Coalescer` the acks that arrive while one batch is being written wait together and go in the next
batch. A lone ack is written at once, as before: batching only happens under load, and each caller
still awaits its own outcome (so a tunnel's frames stay in order: its Result is recorded after its Ack).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")
Outcome = TypeVar("Outcome")


class Coalescer(Generic[Item, Outcome]):
    """Run `write(items)` for whatever was submitted while the previous write ran.

    `write` gets a list of items and returns one outcome per item, in order; an outcome that is an
    exception is raised to that item's submitter only. If `write` raises for a batch of several
    items (one bad value can fail a whole statement), each item is written again on its own, so
    only the submitter of the bad one gets the error.
    """

    def __init__(self, write: Callable[[list[Item]], Awaitable[list[Outcome | Exception]]], max_batch: int = 500):
        self._write = write
        self._max_batch = max_batch
        self._pending: list[tuple[Item, asyncio.Future[Outcome]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def submit(self, item: Item) -> Outcome:
        """Queue `item` for the next batch and wait for its outcome."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new event loop (tests): state from the old one is void
            self._loop, self._pending, self._writer = loop, [], None
        future: asyncio.Future[Outcome] = loop.create_future()
        self._pending.append((item, future))
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        batch: list[tuple[Item, asyncio.Future[Outcome]]] = []
        try:
            while self._pending:
                batch, self._pending = self._pending[: self._max_batch], self._pending[self._max_batch :]
                await self._write_batch(batch)
        except BaseException:  # cancelled (loop shutting down): nobody may wait forever
            for _, future in [*batch, *self._pending]:
                future.cancel()
            self._pending = []
            raise

    async def _write_batch(self, batch: list[tuple[Item, asyncio.Future[Outcome]]]) -> None:
        try:
            outcomes = await self._write([item for item, _ in batch])
        except Exception as exc:
            if len(batch) > 1:  # find the bad item: one at a time
                for one in batch:
                    await self._write_batch([one])
                return
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if future.done():  # the submitter was cancelled (socket closed)
                continue
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

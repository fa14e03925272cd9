"""The worker's record feed: faust's fetched records, handed over a fetch at a time.

faust delivers every record on its own: per record its fetcher waits on two tasks (the
conductor's callback and the flow-control event), makes an event, puts it on the stream's
queue, and the stream runs its processors over it; ``take_events`` then collects what arrived
within a window. Measured on a worker at 1,000 realistic entries/s, that per-record path moved
only ~1,000 records/s into batches: the worker spent as long gathering records between batches
as it spent applying them, and the records waited seconds (issue 25). Ledger records need
none of it: the engine stores its positions in PostgreSQL (no acks or Kafka commits), decodes
and dead-letters itself, and applies in batches. So the worker's consumer puts each fetch's
records here as one list, and the engine's loop takes them, merged into batches.

Order: one consumer puts and one loop takes, first in first out, so each partition's records
come in offset order, contiguous from the worker's last seek. The engine applies only records
past the positions stored in PostgreSQL, so records fetched before a rebalance that took their
partition away are skipped there (or applied first, in order: either way once).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

# The highest offset taken per (topic, partition), and how many entries are still to come
# after them over every assigned partition.
Taken = dict[tuple[str, int], int]
Lag = Callable[[Mapping[tuple[str, int], int]], int]


class Record(Protocol):
    """What the feed reads of a fetched record (faust's message has more)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...


def take(taken: Taken, records: Sequence[Record]) -> None:
    """Note the highest offset per partition of ``records`` in ``taken``."""
    for r in records:
        tp = (r.topic, r.partition)
        if r.offset > taken.get(tp, -1):
            taken[tp] = r.offset


class Feed:
    """Fetched records in, batches out; at most ``max_records`` waiting (the fetcher waits)."""

    def __init__(self, max_records: int) -> None:
        self.max_records = max_records
        self._chunks: deque[list[Any]] = deque()
        self._waiting = 0
        self._arrived = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    @property
    def waiting(self) -> int:
        """Records put and not yet taken."""
        return self._waiting

    async def put(self, records: list[Any]) -> None:
        """Add one fetch's records, in order; waits while the feed is full."""
        if not records:
            return
        while self._waiting >= self.max_records:
            self._room.clear()
            await self._room.wait()
        self._chunks.append(records)
        self._waiting += len(records)
        self._arrived.set()

    def _pop(self, limit: int) -> list[Any]:
        chunk = self._chunks.popleft()
        if len(chunk) > limit:  # the rest stays first in line
            chunk, rest = chunk[:limit], chunk[limit:]
            self._chunks.appendleft(rest)
        self._waiting -= len(chunk)
        if not self._chunks:
            self._arrived.clear()
        if self._waiting < self.max_records:
            self._room.set()
        return chunk

    async def _next(self, limit: int, timeout_s: float | None) -> list[Any] | None:
        if not self._chunks:
            if timeout_s is None:
                await self._arrived.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), timeout_s)
                if not self._chunks:
                    return None
        return self._pop(limit)

    async def batches(
        self, size: int, within_s: float, lag: Lag, backlog: int
    ) -> AsyncIterator[list[Any]]:
        """Batches of at most ``size`` records: everything waiting, and while ``lag`` says at
        least ``backlog`` entries are still to come after them, what arrives within
        ``within_s`` of each other too (a worker behind catches up in fewer, larger batches;
        one that keeps up sends what came as it comes)."""
        while True:
            first = await self._next(size, None)
            assert first is not None
            merged = list(first)
            taken: Taken = {}
            take(taken, first)
            while len(merged) < size:
                if not self._chunks and lag(taken) < backlog:
                    break  # nothing waiting, and not behind: send what came
                more = await self._next(size - len(merged), within_s)
                if more is None:
                    break  # the backlog ran dry
                merged.extend(more)
                take(taken, more)
            yield merged

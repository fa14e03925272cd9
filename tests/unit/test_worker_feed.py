"""The worker's record feed (issue 25): fetches in, batches out, pure asyncio, no services."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

import pytest

from streams.feed import Feed, take
from streams.health import Health


@dataclass(frozen=True)
class Rec:
    topic: str
    partition: int
    offset: int


def recs(partition: int, first: int, n: int) -> list[Rec]:
    return [Rec("p.ledger.a", partition, o) for o in range(first, first + n)]


def never_behind(taken: Mapping[tuple[str, int], int]) -> int:
    return 0


async def next_batch(feed: Feed, size: int, lag: object = never_behind) -> list[Rec]:
    batches = feed.batches(size, within_s=0.01, lag=lag, backlog=100)  # type: ignore[arg-type]
    return await asyncio.wait_for(anext(batches), 1)


def test_everything_waiting_goes_in_one_batch_in_order_up_to_the_size() -> None:
    async def run() -> None:
        feed = Feed(max_records=1000)
        await feed.put(recs(0, 0, 30))
        await feed.put(recs(1, 0, 30))
        await feed.put(recs(0, 30, 30))
        first = await next_batch(feed, 50)
        assert first == recs(0, 0, 30) + recs(1, 0, 20)  # a fetch is split at the size
        second = await next_batch(feed, 50)
        assert second == recs(1, 20, 10) + recs(0, 30, 30)[:40]
        assert feed.waiting == 0

    asyncio.run(run())


def test_a_worker_that_keeps_up_sends_what_came_without_waiting_for_more() -> None:
    async def run() -> None:
        feed = Feed(max_records=1000)
        batches = feed.batches(2000, within_s=5.0, lag=never_behind, backlog=100)
        await feed.put(recs(0, 0, 3))
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await asyncio.wait_for(anext(batches), 1) == recs(0, 0, 3)
        assert loop.time() - started < 1  # not the 5 s window

    asyncio.run(run())


def test_a_worker_behind_waits_for_more_and_merges_until_the_backlog_runs_dry() -> None:
    async def run() -> None:
        feed = Feed(max_records=1000)
        asked: list[dict[tuple[str, int], int]] = []

        def behind(taken: Mapping[tuple[str, int], int]) -> int:
            asked.append(dict(taken))
            return 500  # always behind: only a dry feed ends the batch

        batches = feed.batches(2000, within_s=0.2, lag=behind, backlog=100)
        await feed.put(recs(0, 0, 10))

        async def later() -> None:
            await asyncio.sleep(0.05)
            await feed.put(recs(2, 7, 5))

        task = asyncio.create_task(later())
        batch = await asyncio.wait_for(anext(batches), 2)
        await task
        assert batch == recs(0, 0, 10) + recs(2, 7, 5)
        assert asked[0] == {("p.ledger.a", 0): 9}  # the lag is asked after what was taken
        assert asked[-1] == {("p.ledger.a", 0): 9, ("p.ledger.a", 2): 11}

    asyncio.run(run())


def test_a_full_feed_makes_the_fetcher_wait_until_records_are_taken() -> None:
    async def run() -> None:
        feed = Feed(max_records=20)
        await feed.put(recs(0, 0, 20))
        blocked = asyncio.create_task(feed.put(recs(0, 20, 5)))
        await asyncio.sleep(0.05)
        assert not blocked.done() and feed.waiting == 20
        assert await next_batch(feed, 15) == recs(0, 0, 15)
        await asyncio.wait_for(blocked, 1)
        assert feed.waiting == 10
        assert await next_batch(feed, 100) == recs(0, 15, 10)

    asyncio.run(run())


def test_an_empty_fetch_is_not_a_batch() -> None:
    async def run() -> None:
        feed = Feed(max_records=10)
        await feed.put([])
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(feed.batches(10, 0.01, never_behind, 100)), 0.1)

    asyncio.run(run())


def test_take_keeps_the_highest_offset_per_partition() -> None:
    taken: dict[tuple[str, int], int] = {}
    take(taken, [Rec("t", 0, 5), Rec("t", 1, 2), Rec("t", 0, 3)])
    assert taken == {("t", 0): 5, ("t", 1): 2}


def test_behind_counts_every_assigned_partition_after_what_was_taken() -> None:
    a, b, c = ("p.ledger.a", 0), ("p.ledger.a", 1), ("p.ledger.b", 0)
    h = Health(started=0.0)
    h.assigned({a: 10, b: 0, c: 4}, now=1.0)
    # a: taken up to 19 of 25 (5 to come); b: nothing taken, 40 to come; c: mark unknown
    assert h.behind({a: 25, b: 40, c: None}, {a: 19}) == 5 + 40
    h.applied({b: 39}, records=40, now=2.0)
    assert h.behind({a: 25, b: 40, c: None}, {a: 24}) == 0
    assert h.behind({a: 25, b: 40}, {("other", 0): 99}) == 15  # not assigned: ignored

"""Partition-parallel replay: a share that fails stops the replay with its error, never hangs."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import TopicPartition

from infra.settings import Settings
from streams.parallel import ParallelReplayError, Share, drain_parallel
from streams.source import balanced


def test_a_failing_share_raises_its_error() -> None:
    settings = Settings()
    shares = [
        Share(
            settings,
            (("no-such-projection", "b1"),),
            False,
            ("t",),
            i,
            (("t", i),),
            100,
            None,
            False,
        )
        for i in range(2)
    ]
    with pytest.raises(ParallelReplayError, match="no projection or group named"):
        asyncio.run(drain_parallel(shares))


def tp(topic: str, partition: int) -> TopicPartition:
    return TopicPartition(topic, partition)


def test_balanced_gives_every_partition_to_exactly_one_share() -> None:
    sizes = {tp(t, p): (p * 37 + len(t) * 11) % 50 for t in ("a", "bb", "ccc") for p in range(7)}
    for count in (1, 2, 3, 5, 30):
        shares = balanced(sizes, count)
        assert len(shares) == count
        flat = [x for share in shares for x in share]
        assert sorted(flat) == sorted(sizes)  # each once: none left out, none twice
        assert all(share == sorted(share) for share in shares)


def test_balanced_evens_out_entries_where_every_nth_partition_did_not() -> None:
    # a few long runs fill a few partitions: what every other partition gave was 2:1
    sizes = {tp("f", p): n for p, n in enumerate([9_000, 500, 8_000, 600, 7_000, 700, 400, 300])}
    old = [sum(sizes[tp("f", p)] for p in range(i, 8, 2)) for i in range(2)]
    assert max(old) >= 2 * min(old)
    loads = [sum(sizes[x] for x in share) for share in balanced(sizes, 2)]
    assert sum(loads) == sum(sizes.values())
    assert max(loads) - min(loads) <= max(sizes.values())  # (whole partitions: no better)
    assert max(loads) <= 1.5 * min(loads)  # 11,500 / 15,000 here; 24,400 / 2,100 before


def test_balanced_is_deterministic_and_refuses_no_shares() -> None:
    sizes = {tp("x", p): 10 for p in range(6)}  # all ties: broken by topic-partition order
    assert balanced(sizes, 4) == balanced(dict(reversed(list(sizes.items()))), 4)
    assert balanced(sizes, 4) == [
        [tp("x", 0), tp("x", 4)],
        [tp("x", 1), tp("x", 5)],
        [tp("x", 2)],
        [tp("x", 3)],
    ]
    with pytest.raises(ValueError):
        balanced(sizes, 0)

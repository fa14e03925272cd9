"""Partition-parallel replay: a share that fails stops the replay with its error, never hangs."""

from __future__ import annotations

import asyncio

import pytest

from infra.settings import Settings
from streams.parallel import ParallelReplayError, Share, drain_parallel


def test_a_failing_share_raises_its_error() -> None:
    settings = Settings()
    shares = [
        Share(settings, (("no-such-projection", "b1"),), False, ("t",), i, 2, 100, None, False)
        for i in range(2)
    ]
    with pytest.raises(ParallelReplayError, match="no projection or group named"):
        asyncio.run(drain_parallel(shares))

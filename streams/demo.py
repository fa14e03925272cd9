"""``agentledger demo``, the writing half: a simulated fleet published, its topics made first
(``consumers.demo`` follows it into the projections; ``infra.main`` runs both)."""

from __future__ import annotations

import asyncio
import time

from rich.console import Console

from infra.admin import create_fleet_topics
from infra.settings import Settings
from schemas.models import LedgerEntry
from streams.publisher import AsyncPublisher
from streams.simulate import simulate

FLEETS, RUNS = 2, 14


def publish_demo(settings: Settings, console: Console) -> tuple[list[LedgerEntry], float]:
    """The entries published and when publishing began (``time.perf_counter``)."""
    seed = int(time.time())  # new runs every demo; the same seed again would be all duplicates
    entries = simulate(FLEETS, RUNS, seed)
    published_at = time.perf_counter()
    asyncio.run(_publish(settings, entries))
    console.print(
        f"published {len(entries)} entries of {len({e.run_id for e in entries})} runs "
        f"(seed {seed}) to {settings.topic_prefix}.ledger.fleet-01/02; secrets redacted at the "
        "publisher"
    )
    return entries, published_at


async def _publish(settings: Settings, entries: list[LedgerEntry]) -> None:
    # The demo makes its fleets (fleet-01/02), so it creates their topics as `topics create` does
    # (already there when AGENTLEDGER_FLEETS names them: `infra up` made them).
    await create_fleet_topics(settings, sorted({e.fleet_id for e in entries}))
    async with AsyncPublisher(settings) as publisher:
        await publisher.publish_batch(entries)

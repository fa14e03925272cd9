"""Publishing imported runs: only what the ledger does not hold yet.

For every run it first reads where the run stands on its ledger partition (its highest sequence
number), then sends the entries after it, in batches, each batch all or nothing. So importing a
file again publishes nothing, and an import stopped half way resumes where it stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from infra.settings import Settings
from streams.importers.base import ImportedRun
from streams.publisher import AsyncPublisher

BATCH = 500


@dataclass(frozen=True)
class Sent:
    run_id: str
    already: int  # entries the ledger held before
    sent: int


async def publish_runs(
    settings: Settings,
    runs: Sequence[ImportedRun],
    progress: Callable[[Sent], None] | None = None,
) -> list[Sent]:
    """Send each run's entries after the ledger's last one; returns what each run got."""
    out: list[Sent] = []
    if not runs:
        return out
    async with AsyncPublisher(settings) as publisher:
        stand = await publisher.resume({(r.fleet_id, r.run_id) for r in runs})
        for run in runs:
            last = stand.get(run.run_id, 0)
            todo = [e for e in run.entries if e.sequence_no > last]
            for start in range(0, len(todo), BATCH):
                await publisher.publish_batch(todo[start : start + BATCH])
            done = Sent(run.run_id, min(last, len(run.entries)), len(todo))
            out.append(done)
            if progress is not None:
                progress(done)
    return out

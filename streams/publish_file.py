"""``agentledger publish FILE.jsonl``: valid lines are sent, invalid ones reported with reasons."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from infra.settings import Settings
from schemas.errors import LedgerValidationError
from schemas.json_form import from_json_text
from streams.publisher import AsyncPublisher, Prepared

BATCH = 500


@dataclass
class PublishReport:
    sent: int = 0
    invalid: list[tuple[int, str]] = field(default_factory=list)
    by_fleet: dict[str, int] = field(default_factory=dict)


async def publish_file(path: Path, settings: Settings) -> PublishReport:
    report = PublishReport()
    async with AsyncPublisher(settings) as publisher:
        batch: list[Prepared] = []
        with path.open("rb") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    batch.append(publisher.stage(from_json_text(line)))
                except LedgerValidationError as exc:
                    report.invalid.append((number, str(exc)))
                if len(batch) >= BATCH:
                    await _send(publisher, batch, report)
                    batch = []
        await _send(publisher, batch, report)
    return report


async def _send(publisher: AsyncPublisher, batch: list[Prepared], report: PublishReport) -> None:
    if not batch:
        return
    await publisher.send(batch)
    report.sent += len(batch)
    for p in batch:
        report.by_fleet[p.entry.fleet_id] = report.by_fleet.get(p.entry.fleet_id, 0) + 1

"""``agentledger publish FILE.jsonl``: valid lines are sent, invalid ones reported with reasons."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from infra.settings import Settings
from schemas.errors import LedgerValidationError
from schemas.json_form import from_json_text
from streams.publisher import AsyncPublisher, BrokerUnavailableError, Prepared

BATCH = 500


@dataclass
class PublishReport:
    sent: int = 0
    invalid: list[tuple[int, str]] = field(default_factory=list)
    by_fleet: dict[str, int] = field(default_factory=dict)


@dataclass
class _Progress:
    """How far the file got, for the account given when Kafka stops answering."""

    read: int = 0  # valid entries read (and staged) so far
    line: int = 0  # number of the last line read
    sending: int = 0  # entries in the batch being sent (0 between batches)
    eof: bool = False


async def publish_file(path: Path, settings: Settings) -> PublishReport:
    report = PublishReport()
    progress = _Progress()
    try:
        async with AsyncPublisher(settings) as publisher:
            batch: list[Prepared] = []
            with path.open("rb") as lines:
                for number, line in enumerate(lines, start=1):
                    progress.line = number
                    if not line.strip():
                        continue
                    try:
                        batch.append(publisher.stage(from_json_text(line)))
                        progress.read += 1
                    except LedgerValidationError as exc:
                        report.invalid.append((number, str(exc)))
                    if len(batch) >= BATCH:
                        await _send(publisher, batch, report, progress)
                        batch = []
            progress.eof = True
            await _send(publisher, batch, report, progress)
    except BrokerUnavailableError as exc:
        if progress.eof and progress.sending == 0 and report.sent == progress.read:
            return report  # every entry was acknowledged; only the disconnect failed
        raise _stopped(path, settings, report, progress, exc) from exc
    return report


async def _send(
    publisher: AsyncPublisher, batch: list[Prepared], report: PublishReport, progress: _Progress
) -> None:
    if not batch:
        return
    progress.sending = len(batch)
    await publisher.send(batch)
    progress.sending = 0
    report.sent += len(batch)
    for p in batch:
        report.by_fleet[p.entry.fleet_id] = report.by_fleet.get(p.entry.fleet_id, 0) + 1


def _stopped(
    path: Path,
    settings: Settings,
    report: PublishReport,
    progress: _Progress,
    exc: BrokerUnavailableError,
) -> BrokerUnavailableError:
    """The account of a file Kafka cut short, in the file's terms. The advice is the whole file
    again, not its unacknowledged lines: a new run numbers each run's entries from 1, so only the
    complete file passes the sequence check, and what did arrive is skipped as a duplicate."""
    if report.sent == 0 and progress.sending == 0:
        return BrokerUnavailableError(
            f"publishing {path}: nothing was published: {exc}; publish the file again once "
            "Kafka answers"
        )
    acked = report.sent + len(exc.acknowledged)
    not_acked = progress.sending - len(exc.acknowledged)
    rest = "" if progress.eof else f", the lines after line {progress.line} not sent"
    return BrokerUnavailableError(
        f"publishing {path}: Kafka at {settings.kafka_address} stopped answering "
        f"({exc.cause}): {acked} of the file's {progress.read} entries read so far "
        f"acknowledged, {not_acked} not{rest}; publish the whole file again (entries that did "
        "arrive are skipped as duplicates)",
        acknowledged=exc.acknowledged,
        unacknowledged=exc.unacknowledged,
        cause=exc.cause,
    )
